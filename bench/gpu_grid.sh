#!/bin/sh
# bench/gpu_grid.sh: issue 20's predicted-against-measured grid on one GPU. `measure` trains
# every configuration with zreal --backend cuda (on the GPU machine); `predict` simulates each
# with zplan on a profile (hwprofiles/GPU-measured.json, fitted from the microbenchmarks under
# OUTDIR/microbench); `report` writes OUTDIR/README.md from the JSON of both. Usage:
#   sh bench/gpu_grid.sh measure|predict|report|list
# GPU names the device (h100 or h200, default h100); OUTDIR defaults to reports/gpu for the
# H100 and reports/gpu/GPU for another.
# Configurations: gpt2-124m and gpt2-1.5b on one GPU (ranks 1), stages 0-3, micro-batches 1,
# 4 and 16, with and without activation checkpointing; and one rank of 8 and of 64 emulated
# (--emulate N), stages 1-3, micro-batch 4, checkpointing. Sequence 1,024, bf16, no dropout.
set -eu
cd "$(dirname "$0")/.."
gpu=${GPU:-h100}
case $gpu in h100) out=${OUTDIR:-reports/gpu} ;; *) out=${OUTDIR:-reports/gpu/$gpu} ;; esac
build=${BUILD:-build}
profile=${PROFILE:-hwprofiles/$gpu-measured.json}
steps=${STEPS:-4}

# One configuration a line: NAME MODEL RANKS STAGE MICRO_BATCH CHECKPOINT(0|1)
list() {
    for model in gpt2-124m gpt2-1.5b; do
        for stage in 0 1 2 3; do
            for micro in 1 4 16; do
                for ckpt in 0 1; do
                    echo "$model-n1-s$stage-mb$micro-c$ckpt $model 1 $stage $micro $ckpt"
                done
            done
        done
        for ranks in 8 64; do
            for stage in 1 2 3; do
                echo "$model-n$ranks-s$stage-mb4-c1 $model $ranks $stage 4 1"
            done
        done
    done
}

# each FUNCTION: FUNCTION NAME MODEL RANKS STAGE MICRO_BATCH [--checkpoint] per configuration.
each() {
    list | while read -r name model ranks stage micro ckpt; do
        flag=""
        [ "$ckpt" = 1 ] && flag=--checkpoint
        "$1" "$name" "$model" "$ranks" "$stage" "$micro" $flag
    done
}

# A configuration whose measured JSON is already there is skipped: a lease that ran out of time
# leaves the rest to the next (bench/gpu_session.sh's GRID_FROM).
measure_one() {
    name=$1 model=$2 ranks=$3 stage=$4 micro=$5
    shift 5
    [ -e "$out/measured/$name.json" ] && return 0
    if "$build/zreal" --model "$model" --backend cuda --emulate "$ranks" --stage "$stage" \
        --micro-batch "$micro" "$@" --steps "$steps" --out "$out/measured/$name.json" \
        >"$out/measured/$name.log" 2>&1; then
        rm -f "$out/measured/$name.log"
        echo "measured $name"
    else
        echo "measured $name: zreal failed: $(tail -n 1 "$out/measured/$name.log")"
    fi
}

predict_one() {
    name=$1 model=$2 ranks=$3 stage=$4 micro=$5
    shift 5
    "$build/zplan" simulate --impl paper --model "$model" --cluster "$profile" --gpus "$ranks" \
        --stage "$stage" --micro-batch "$micro" "$@" --precision bf16 --no-dropout \
        --attention eager --json >"$out/predicted/$name.json" ||
        [ $? -eq 2 ] # 2: predicted not to fit, the JSON is written
}

case ${1:-} in
list) list ;;
measure) mkdir -p "$out/measured" && each measure_one ;;
predict) mkdir -p "$out/predicted" && each predict_one &&
    echo "predicted $(list | wc -l) configurations on $profile" ;;
report) python3 reports/gpu/generate.py "$out" --gpu "$gpu" ;;
*) echo "usage: sh bench/gpu_grid.sh measure|predict|report|list" >&2; exit 2 ;;
esac
