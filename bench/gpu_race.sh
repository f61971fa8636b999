#!/bin/sh
# bench/gpu_race.sh: zreal --backend cuda against PyTorch (eager and torch.compile,
# bench/torch_gpt2.py) training gpt2-124m on one GPU; prints step time, tokens/s, MFU and peak
# memory side by side. Usage: sh bench/gpu_race.sh [MICRO_BATCH] [STEPS] (default 8 and 10);
# BUILD=dir picks the build (default build). The sequence length is the model file's (1024);
# the model file gives no micro-batch, so 8 (8192 tokens a step) is this script's choice.
# MFU = 6 * params * tokens/s / peak, the usual dense-model count (attention's s^2 FLOPs left
# out), with the peak from hwprofiles/dgx-h100.json: 989 TFLOP/s dense bf16 (NVIDIA H100 SXM
# datasheet; also ../shared/reference/field-facts.md). Only meaningful on an H100 SXM.
set -eu
cd "$(dirname "$0")/.."
build=${BUILD:-build}
micro=${1:-8}
steps=${2:-10}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# zreal times every step but the first (one-time costs), so one step more than PyTorch's
# timed ones. Stage 0: on one GPU the stages differ only in layout.
"$build/zreal" --emulate 1 --model gpt2-124m --backend cuda --stage 0 --micro-batch "$micro" \
    --steps $((steps + 1)) --out "$tmp/zreal.json" 2>"$tmp/zreal.log" ||
    { cat "$tmp/zreal.log" >&2; exit 1; }
# Without PyTorch (a machine with no network cannot install it) zreal's row still prints.
if python3 -c 'import torch' 2>/dev/null; then
    python3 bench/torch_gpt2.py --micro-batch "$micro" --steps "$steps" >"$tmp/torch.jsonl"
else
    echo "gpu_race: no PyTorch for python3 here: its rows are left out" >&2
    : >"$tmp/torch.jsonl"
fi

python3 - "$tmp" <<'EOF'
import json, os, sys

tmp = sys.argv[1]
with open("models/gpt2-124m.json") as f:
    m = json.load(f)
with open("hwprofiles/dgx-h100.json") as f:
    peak_flops = json.load(f)["peak_bf16_flops"]
L, h, V, s = m["layers"], m["hidden"], m["vocab"], m["seq_len"]
params = L * (12 * h * h + 13 * h) + V * h + s * h + 2 * h  # tied embedding, as zreal counts
with open(os.path.join(tmp, "zreal.json")) as f:
    z = json.load(f)
rank = z["ranks"][0]
micro = z["plan"]["micro_batch"]
rows = [{
    "system": "zreal-cuda",
    "step_time_s": z["step_time_s"],
    "tokens_per_s": micro * s / z["step_time_s"],
    "peak_memory_bytes": rank["peak_memory_bytes"],
    "peak_reserved_bytes": rank["device_memory"]["pool_peak_reserved_bytes"],
    "loss": z["loss"][-1],
}]
with open(os.path.join(tmp, "torch.jsonl")) as f:
    rows += [json.loads(line) for line in f if line.strip()]
print("gpt2-124m (%d parameters), micro-batch %d x seq %d, one GPU; MFU against %.0f TFLOP/s"
      % (params, micro, s, peak_flops / 1e12))
print("%-16s %10s %12s %7s %14s %14s %8s" % ("system", "step ms", "tokens/s", "MFU",
                                              "peak alloc GB", "peak pool GB", "loss"))
for r in rows:
    mfu = 6.0 * params * r["tokens_per_s"] / peak_flops
    print("%-16s %10.1f %12.0f %6.1f%% %14.2f %14.2f %8.3f"
          % (r["system"], 1e3 * r["step_time_s"], r["tokens_per_s"], 100 * mfu,
             r["peak_memory_bytes"] / 1e9, r["peak_reserved_bytes"] / 1e9, r["loss"]))
print("zreal's ops (seconds per step):",
      ", ".join("%s %.4f" % (k, v["total_s"]) for k, v in rank["ops"].items()))
print("zreal's device memory:", json.dumps(rank["device_memory"]))
EOF
