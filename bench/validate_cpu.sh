#!/bin/sh
# bench/validate_cpu.sh: issue 5's prediction check on this machine. Calibrates a profile from
# microbenchmarks only, then predicts and measures zreal runs of the tiny and cpu-small models
# and prints `zplan validate` for each. Usage: sh bench/validate_cpu.sh [RANKS] (default 2).
set -eu
cd "$(dirname "$0")/.."
ranks=${1:-2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun --oversubscribe -np "$ranks" build/zreal --microbench --out "$tmp/microbench.json"
build/zplan calibrate "$tmp/microbench.json" --name cpu-local --out "$tmp/cpu-local.json"
for run in "tiny 8" "cpu-small 4"; do
    set -- $run
    for stage in 0 3; do
        echo "== $1, stage $stage, $ranks ranks, micro-batch $2"
        build/zplan simulate --impl paper --model "$1" --cluster "$tmp/cpu-local.json" --gpus "$ranks" \
            --stage "$stage" --micro-batch "$2" --precision bf16 --no-dropout --persistence-threshold 0 \
            --json >"$tmp/predicted.json"
        mpirun --oversubscribe -np "$ranks" build/zreal --model "$1" --stage "$stage" \
            --micro-batch "$2" --persistence-threshold 0 --steps 10 \
            --out "$tmp/measured.json" 2>/dev/null
        build/zplan validate "$tmp/predicted.json" "$tmp/measured.json" | tail -n +5
    done
done
