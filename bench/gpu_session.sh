#!/bin/sh
# bench/gpu_session.sh: everything issue 20 runs on a lent GPU machine, in phases, each with
# its log under /tmp/gpu_session and a one-line verdict; at exit all of it is packed into
# $OUT/session.tgz (the device tool returns at most 8 files).
#   sh bench/gpu_session.sh PHASE... ; phases: setup build test validate race emulate
#   microbench (or microbench-bf16, microbench-fp32) grid probe. `setup` must come first in
#   every call (a fresh machine is bare): it unpacks bench/device_kit.sh's libraries
#   (.devkit, carried) and finds NCCL (CUDA's tree, else the PyTorch wheel's nvidia/nccl).
# Times on an H200 (2026-11-29): build 9 s, test 44 s, validate 31 s, emulate 13 s,
# microbench about 6 minutes per GEMM mode (give each mode a call of its own).
set -u
cd "$(dirname "$0")/.."
out=${OUTDIR:-/tmp/gpu_session}
mkdir -p "$out"
[ -n "${OUT:-}" ] && trap 'tar czf "$OUT/session.tgz" -C "$out" .' EXIT
build=${BUILD:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# phase NAME COMMAND...: runs COMMAND with its output in $out/NAME.log, prints the verdict.
phase() {
    name=$1
    shift
    t0=$(date +%s)
    if "$@" >"$out/$name.log" 2>&1; then verdict=ok; else verdict="FAILED (exit $?)"; fi
    echo "== $name: $verdict in $(($(date +%s) - t0)) s"
    [ "$verdict" = ok ] || tail -n 25 "$out/$name.log"
}

do_setup() {
    eval "$(sh bench/device_kit.sh env .devkit)"
    nccl_home=/usr/local/cuda
    if [ ! -e /usr/local/cuda/lib64/libnccl.so.2 ]; then
        nccl_home=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' \
                    2>/dev/null)
    fi
    export NCCL_HOME=$nccl_home
    # The GPU's short name (h100, h200, ...) names the microbenchmark files.
    gpu_tag=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 |
              sed 's/^NVIDIA //; s/ .*//' | tr 'A-Z' 'a-z')
    : "${gpu_tag:=gpu}"
    echo "== setup: NCCL_HOME=$NCCL_HOME; $(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader); load $(cut -d' ' -f1-3 /proc/loadavg)"
}

probe() {
    nvidia-smi
    /usr/local/cuda/bin/nvcc --version | tail -1
    gcc --version | head -1
    ls -la "$NCCL_HOME"/lib*/libnccl* "$NCCL_HOME"/include/nccl.h
    python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'
    cat /etc/os-release | head -2
    nproc
}

build_all() { make -j16 BUILD="$build" NCCL_HOME="$NCCL_HOME" all; }

# Every CUDA backend test program (tests/gpu/test_*), each run even when one before fails.
gpu_tests() {
    status=0
    for t in "$build"/tests/gpu/test_*; do
        echo "== $t"
        "$t" || status=1
    done
    return $status
}

validate() { sh bench/gpu_validate.sh "$build"; }

race() { BUILD="$build" sh bench/gpu_race.sh 8 10; }

# The 7.5B model's rank 0 of 64, predicted on EMULATE_CLUSTER (default dgx-h100).
emulate() {
    for micro in 1 4; do
        "$build/zplan" simulate --impl paper --model gpt-7.5b --stage 3 --micro-batch "$micro" \
            --checkpoint --cluster "${EMULATE_CLUSTER:-hwprofiles/dgx-h100.json}" --gpus 64 \
            --precision bf16 --no-dropout --attention eager --json \
            >"$out/emulate-7.5b-mb$micro-predicted.json" &&
        "$build/zreal" --model gpt-7.5b --stage 3 --micro-batch "$micro" --checkpoint \
            --backend cuda --emulate 64 --rank 0 --steps 3 \
            --out "$out/emulate-7.5b-mb$micro-measured.json" &&
        "$build/zplan" validate "$out/emulate-7.5b-mb$micro-predicted.json" \
            "$out/emulate-7.5b-mb$micro-measured.json" || return 1
    done
}

# Both GEMM modes (the bf16 and the fp32 peak), one rank of a node of 8 emulated (its
# collectives are the device-to-device copies that stand in for NVLink's).
# microbench-bf16 and microbench-fp32 run one mode each (about 6 minutes each on an H200).
microbench_mode() {
    ZREAL_CUDA_GEMM=$1 "$build/zreal" --backend cuda --emulate 8 --microbench \
        --out "$out/microbench-$gpu_tag-$1.json"
}
microbench() { microbench_mode bf16 && microbench_mode fp32; }

# Where the time goes: every kernel of one zreal step of gpt2-124m (Nsight Compute, one
# metric, clocks as found) and PyTorch eager's kernels from its profiler.
profile() {
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
    "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
        "$build/zreal" --emulate 1 --model gpt2-124m --backend cuda --micro-batch 8 --steps 1 \
        >"$out/ncu-zreal.csv" || return 1
    python3 bench/torch_gpt2.py --micro-batch 8 --steps 3 --modes eager --profile
}

# The predicted-against-measured grid: sh bench/gpu_grid.sh measures, under $out/grid/.
# GRID_FROM=reports/gpu/h200 starts from that folder's measured configurations and measures
# the rest (the H200's first lease measured 49 of 60 in its time).
grid() {
    mkdir -p "$out/grid/measured"
    if [ -n "${GRID_FROM:-}" ]; then cp "$GRID_FROM"/measured/*.json "$out/grid/measured/" || return 1; fi
    OUTDIR="$out/grid" BUILD="$build" timeout "${GRID_TIMEOUT_S:-420}" sh bench/gpu_grid.sh measure
}

for p in "$@"; do
    case $p in
    setup) do_setup ;;
    probe) phase probe probe ;;
    build) phase build build_all ;;
    test) phase test gpu_tests ;;
    validate) phase validate validate ;;
    race) phase race race ;;
    emulate) phase emulate emulate ;;
    microbench) phase microbench microbench ;;
    microbench-bf16) phase microbench-bf16 microbench_mode bf16 ;;
    microbench-fp32) phase microbench-fp32 microbench_mode fp32 ;;
    grid) phase grid grid ;;
    profile) phase profile profile ;;
    *) echo "gpu_session: unknown phase '$p'" >&2; exit 2 ;;
    esac
done
