#!/bin/sh
# bench/torch_calibrate_check.sh: issue 41's GPU check. Profiles bench/torch_profile.py at one
# configuration (GPT-2 124M, micro-batch 8, sequence 1024, bf16), calibrates a profile from its
# trace (zplan calibrate --torch-trace), then runs four others (micro-batch 4 and 16, sequence
# 2048, GPT-2 1.5B at micro-batch 8) and sets each against zplan's prediction on that profile
# (zplan validate --torch-trace --torch-steps): step time, peak reserved and allocated memory and
# each kernel class. Usage: sh bench/torch_calibrate_check.sh [BUILD [BASE_PROFILE [OUT]]]
# (defaults build, dgx-h100, reports/gpu/torch-calibrate). Needs one GPU and PyTorch. Writes
# into OUT each run's steps file and validate's JSON, the calibrated profile and a summary
# table (summary.txt), never the traces (they stay in a temporary folder). Target: step time
# within 5% and peak reserved memory within 3% in every case. The plans say --impl fsdp: the
# script trains as plain PyTorch does (autocast over fp32 parameters), not as DeepSpeed's engine.
set -eu
cd "$(dirname "$0")/.."
build=${1:-build}
base=${2:-dgx-h100}
out=${3:-reports/gpu/torch-calibrate}
python3 -c 'import torch; assert torch.cuda.is_available()' || {
    echo "torch_calibrate_check: PyTorch with a CUDA device is needed" >&2
    exit 1
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"

# profile NAME MODEL MICRO_BATCH SEQ: a run's trace into $tmp/NAME, its steps file into $out.
profile() {
    python3 bench/torch_profile.py --model "models/$2.json" --micro-batch "$3" --seq "$4" \
        --steps 3 --warmup 3 --out "$tmp/$1" >"$tmp/$1.log" 2>&1 || {
        echo "torch_calibrate_check: $1 failed:" >&2
        tail -20 "$tmp/$1.log" >&2
        exit 1
    }
    cp "$tmp/$1/steps-rank0.json" "$out/$1-steps.json"
}

profile base gpt2-124m 8 1024
"$build/zplan" calibrate --torch-trace "$tmp/base/trace-rank0.json.gz" --cluster "$base" \
    --out "$out/torch-calibrated.json" >"$out/calibrate.txt"

: >"$out/summary.txt"
for run in "mb4 gpt2-124m 4 1024" "mb16 gpt2-124m 16 1024" "seq2048 gpt2-124m 8 2048" \
           "gpt2-1.5b gpt2-1.5b 8 1024" "base gpt2-124m 8 1024"; do
    set -- $run
    [ "$1" = base ] || profile "$@"
    "$build/zplan" validate --torch-trace "$tmp/$1/trace-rank0.json.gz" \
        --torch-steps "$out/$1-steps.json" --model "$2" --cluster "$out/torch-calibrated.json" \
        --gpus 1 --stage 0 --micro-batch "$3" --seq "$4" --precision bf16 --impl fsdp \
        --json >"$out/$1-validate.json"
    python3 - "$1" "$out/$1-validate.json" >>"$out/summary.txt" <<'PY'
import json, sys
rows = json.load(open(sys.argv[2]))["rows"]
cells = ["%s %s" % (r["quantity"], "-" if r["miss"] is None else "%+.1f%%" % (100 * r["miss"]))
         for r in rows]
print(sys.argv[1] + ": " + "; ".join(cells))
PY
done
cat "$out/summary.txt"
