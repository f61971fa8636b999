#!/bin/sh
# bench/emulate_7_5b.sh: issue 6's emulated-rank check. One process plays rank 0 of the 7.5B
# model on 64 GPUs under ZeRO-3 and `zplan validate` sets its memory beside the simulator's.
# Usage: sh bench/emulate_7_5b.sh [STEPS [ZREAL FLAGS...]], e.g. `2 --backend cuda` on a GPU
# (default 1 step on this machine's backend; on a CPU one step of 7.5B takes many minutes).
set -eu
cd "$(dirname "$0")/.."
steps=${1:-1}
[ $# -gt 0 ] && shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plan="--model gpt-7.5b --stage 3 --micro-batch 1 --checkpoint"
# Progress on stderr when it is a terminal (zreal adds a line per step).
say() { if [ -t 2 ]; then echo "emulate_7_5b: $*" >&2; fi; }
say "1/3 predicting with zplan simulate"
build/zplan simulate --impl paper $plan --cluster dgx-h100 --gpus 64 --precision bf16 --no-dropout --attention eager --json >"$tmp/predicted.json"
say "2/3 measuring rank 0 of 64 with zreal, $steps step(s) (minutes per step on a CPU)"
build/zreal $plan --emulate 64 --rank 0 --steps "$steps" --out "$tmp/measured.json" "$@"
say "3/3 validating"
build/zplan validate "$tmp/predicted.json" "$tmp/measured.json"
