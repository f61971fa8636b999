#!/bin/sh
# bench/pipe_bubble.sh: the pipeline bubble of issue 18 on this machine. zreal trains four equal
# blocks (bench/pipe_model.json) over 4 stages, one rank each, with 8 micro-batches, GPipe and
# 1F1B; bench_pipe simulates the same schedule with every compute op costed at the time zreal
# measured for its kind on its stage, and prints per stage the measured and simulated bubble
# (the step less the stage's compute and sends) with the load average when it ran. With fewer
# cores than ranks, a stage idle in the bubble hands its core to the busy ones, whose ops then
# run faster than their mean over the step, so the measured bubble comes out smaller.
# Usage: sh bench/pipe_bubble.sh [BUILD]
# Environment (defaults): MICRO_BATCH (8), STEPS (4), SCHEDULES ("gpipe 1f1b").
set -eu
cd "$(dirname "$0")/.."
build=${1:-build}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
for schedule in ${SCHEDULES:-gpipe 1f1b}; do
  echo "load: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
  mpirun --oversubscribe -np 4 "$build/zreal" --model bench/pipe_model.json --pp 4 \
    --pp-schedule "$schedule" --grad-accum 8 --micro-batch "${MICRO_BATCH:-8}" \
    --steps "${STEPS:-4}" --out "$out/$schedule.json" 2>/dev/null
  "$build/bench/bench_pipe" "$out/$schedule.json"
done
