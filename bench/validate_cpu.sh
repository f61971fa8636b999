#!/bin/sh
# bench/validate_cpu.sh: the accuracy benchmark of issue 15 on this machine. For each rank count
# it calibrates a profile from microbenchmarks only (`zreal --microbench` of every model's own
# kernels, `zplan calibrate`), then for every model, ZeRO stage and checkpointing choice it
# predicts the step (`zplan simulate`) and measures it REPEATS times (`zreal`); the run with the
# median step is validated against the prediction (`zplan validate`: per op kind).
# The host's speed swings by up to 2x over minutes on this shared machine, so nothing is timed in
# one stretch: each model is microbenchmarked MB_REPEATS times, in turns with the other models
# (`zplan calibrate` keeps each op's fastest run: load only adds time), and a case's REPEATS runs fall in
# REPEATS rounds over every case, so that one slow spell reaches one run of a case, not all.
# Prints one row per case (with the load average when it ran) and the median and worst error;
# keeps every profile, prediction, measurement and report under OUTDIR.
# Then, for the WORST cases (3) by |error|, every op kind's predicted against measured time.
# Usage: sh bench/validate_cpu.sh [OUTDIR]   (on a quiet machine: check `uptime` first)
# Environment (defaults): RANKS ("1 2 4"; above the cores, ranks are oversubscribed),
# STAGES ("0 1 2 3"), CKPT ("0 1"), REPEATS (3), MB_REPEATS (3), STEPS (5: the fewest a run takes),
# TIMED_S (2: a run takes enough steps to time about this long), MAX_STEPS (60), MODELS ("tiny:8
# cpu-small:4 llama-tiny:8 gpt2-124m:1:256", each name:micro-batch[:sequence length]), WORST (3).
# Each microbenchmark also times every compute op whole in a step's sequence (real_opseq) with
# N ranks at once: the profiles take those times first (zp_cost), the kernel sums otherwise.
set -eu
cd "$(dirname "$0")/.."
# What it runs, built here (run alone, the missing probe printed -nan for the host's speed)
make -s build/zplan build/zreal build/bench/bench_gemm
out=${1:-$(mktemp -d)}
mkdir -p "$out"
: >"$out/table.txt"
: >"$out/cases.txt"
rm -f "$out"/probe-n*.txt
RANKS=${RANKS:-"1 2 4"}
STAGES=${STAGES:-"0 1 2 3"}
CKPT=${CKPT:-"0 1"}
REPEATS=${REPEATS:-3}
MB_REPEATS=${MB_REPEATS:-3}
STEPS=${STEPS:-5}
TIMED_S=${TIMED_S:-2}
MAX_STEPS=${MAX_STEPS:-60}
MODELS=${MODELS:-"tiny:8 cpu-small:4 llama-tiny:8 gpt2-124m:1:256"}
WORST=${WORST:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One BLAS thread per rank, in the microbenchmarks and the runs alike (override with
# OPENBLAS_NUM_THREADS). On this 2-vCPU machine a rank alone with zreal's default of two
# threads was slower and unsteady: cpu-small stepped in 861 ms against 549 ms with one, and
# its block_fwd timed 50 ms in one microbenchmark and 75 ms in the next.
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}

load() { cut -d' ' -f1 /proc/loadavg; }
# The host's speed now: a 512^3 sgemm's GFLOP/s (bench_gemm --probe, 0.3 s) on N cores at
# once (at most the cores), the slowest's, since a vCPU's neighbour on the host may be busy.
probe() {
    k=$(($1 < $(nproc) ? $1 : $(nproc)))
    i=0
    while [ "$i" -lt "$k" ]; do
        OPENBLAS_NUM_THREADS=1 build/bench/bench_gemm --probe >"$out/probe.$i" &
        i=$((i + 1))
    done
    wait
    sort -g "$out"/probe.* | head -n 1
    rm -f "$out"/probe.*
}
# The host's jiffies so far: "steal total" from /proc/stat's cpu line (steal is time the
# hypervisor gave this guest's vCPUs to others, noise no model of this machine can see).
jiffies() { awk '/^cpu / {t = 0; for (i = 2; i <= 9; i++) t += $i; print $9, t}' /proc/stat; }
field() { echo "$1" | cut -d: -f"$2"; }
seq_flag() { s=$(field "$1" 3); [ -n "$s" ] && echo "--seq $s" || true; }
# Calls "$1 MODEL STAGE CKPT" for every case of the grid, in one fixed order.
each_case() {
    for m in $MODELS; do
        for stage in $STAGES; do
            for ck in $CKPT; do
                "$1" "$m" "$stage" "$ck"
            done
        done
    done
}

# The steps a run of case $case takes: STEPS at least, and enough that its timed steps (all but
# the warm-up step 0) last about TIMED_S as predicted, MAX_STEPS at most. Steps 1 and 2 of a
# cheap step still pay one-time costs (page faults, the allocator growing): tiny stepped in 33,
# 32, 23, then 15-18 ms, so with 5 steps the mean of its 4 timed steps ran 30% above the rest.
steps_for() {
    jq -r .step_time_s "$out/p-$case.json" 2>/dev/null |
        awk -v min="$STEPS" -v max="$MAX_STEPS" -v t="$TIMED_S" '{v = $1 + 0}
            END {n = v > 0 ? int(t / v) + 2 : min; print (n < min ? min : (n > max ? max : n))}'
}

# Run $r of case ($1 model, $2 stage, $3 checkpointing) with $n ranks: the prediction before
# its first run, the host probe before each (over the calibration's mean, to host-CASE.txt), the
# jiffies around each (to jiffies-CASE.txt), and its row after its last.
run_case() {
    name=$(field "$1" 1) mb=$(field "$1" 2)
    case=$name-n$n-s$2-c$3
    ckflag=""
    [ "$3" = 1 ] && ckflag=--checkpoint
    if [ "$r" = 1 ]; then
        : >"$out/host-$case.txt"
        : >"$out/jiffies-$case.txt"
        # shellcheck disable=SC2046,SC2086
        build/zplan simulate --impl paper --model "$name" $(seq_flag "$1") --cluster "$out/cpu-n$n.json" \
            --gpus "$n" --stage "$2" --micro-batch "$mb" $ckflag --precision bf16 \
            --no-dropout --persistence-threshold 0 --json >"$out/p-$case.json" || true
    fi
    echo "$(probe "$n") $(awk '{s += $1} END {print s / NR}' "$out/probe-n$n.txt")" |
        awk '{print $1 / $2}' >>"$out/host-$case.txt"
    j0=$(jiffies)
    # shellcheck disable=SC2046,SC2086
    mpirun --oversubscribe -np "$n" build/zreal --model "$name" $(seq_flag "$1") \
        --stage "$2" --micro-batch "$mb" $ckflag --persistence-threshold 0 \
        --steps "$(steps_for)" --out "$out/m-$case-$r.json" >/dev/null 2>&1
    echo "$j0 $(jiffies)" >>"$out/jiffies-$case.txt"
    [ "$r" = "$REPEATS" ] && report_case "$2" "$3"
    return 0
}

# The row of case $case ($1 stage, $2 checkpointing): the run with the median step against
# the prediction.
report_case() {
    steal=$(awk '{s += $3 - $1; t += $4 - $2} END {printf "%.1f%%", (t > 0 ? 100 * s / t : 0)}' \
        "$out/jiffies-$case.txt")
    host=$(awk '{s += $1} END {printf "%.2f", s / NR}' "$out/host-$case.txt")
    runs_s=$(for f in "$out"/m-"$case"-*.json; do
        echo "$(jq .step_time_s "$f") $f"; done | sort -g)
    median=$(echo "$runs_s" | sed -n "$(((REPEATS + 1) / 2))p")
    spread=$(echo "$runs_s" | awk -v m="${median%% *}" 'NR == 1 {lo = $1} {hi = $1}
        END {printf "%.1f%%", 100 * (hi - lo) / m}')
    mfile=${median#* }
    build/zplan validate "$out/p-$case.json" "$mfile" >"$out/v-$case.txt" || true
    pred=$(jq .step_time_s "$out/p-$case.json")
    meas=$(jq .step_time_s "$mfile")
    err=$(echo "$pred $meas" | awk '{printf "%+.1f%%", 100 * ($2 - $1) / $1}')
    printf '%-10s %2s %5s %4s %11.4f %11.4f %8s %7s %6s %5s %5s\n' "$name" "$n" "$1" \
        "$2" "$pred" "$meas" "$err" "$spread" "$steal" "$host" "$(load)" | tee -a "$out/table.txt"
    echo "$err $case" | awk '{gsub("[-+%]", "", $1); print}' >>"$out/cases.txt"
}

echo "cores $(nproc), load at start $(load); $STEPS to $MAX_STEPS steps a run (about ${TIMED_S} s timed), median of $REPEATS runs"
# spread: (slowest - fastest) / median of the REPEATS runs of a case, the noise an error is read against;
# steal: the share of the vCPUs' time the hypervisor took while its runs ran;
# host: the mean of the probes just before each of the case's runs over the mean of those around
# the N-rank microbenchmarks (before and after each)
# (above 1: the host ran faster than when the profile was measured, so the case steps faster).
printf '%-10s %2s %5s %4s %11s %11s %8s %7s %6s %5s %5s\n' model N stage ckpt predicted_s measured_s error spread steal host load
# Every microbenchmark first: a profile for N ranks takes its compute rates from the runs with
# N ranks (they shared the cores as training will) and its collectives from every run.
runs=""
for n in $RANKS; do
    rep=1 # (not i: probe's)
    while [ "$rep" -le "$MB_REPEATS" ]; do
        for m in $MODELS; do
            name=$(field "$m" 1)
            probe "$n" >>"$out/probe-n$n.txt"
            # shellcheck disable=SC2046
            mpirun --oversubscribe -np "$n" build/zreal --microbench --model "$name" \
                --micro-batch "$(field "$m" 2)" $(seq_flag "$m") --out "$out/mb-$name-n$n-$rep.json"
            probe "$n" >>"$out/probe-n$n.txt"
            runs="$runs $out/mb-$name-n$n-$rep.json"
        done
        rep=$((rep + 1))
    done
done
for n in $RANKS; do
    # Its warnings stay in the log; a failure (RANKS without a count above 1 has no
    # collectives to fit) is said on stderr, not only there.
    # shellcheck disable=SC2086
    build/zplan calibrate $runs --ranks "$n" --name "cpu-n$n" --out "$out/cpu-n$n.json" \
        >"$out/calibrate-n$n.log" 2>&1 || { tail -n 1 "$out/calibrate-n$n.log" >&2; exit 1; }
    r=1
    while [ "$r" -le "$REPEATS" ]; do
        each_case run_case
        r=$((r + 1))
    done
done
awk '{sub("%", "", $7); e = $7 + 0; print (e < 0 ? -e : e)}' "$out/table.txt" | sort -g |
    awk '{v[NR] = $1} END {printf "median |error| %.1f%%, worst %.1f%% over %d cases\n",
         (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), v[NR], NR}'
sort -gr "$out/cases.txt" | head -n "$WORST" | while read -r e case; do
    echo "worst: $case ($e% off), by op kind (zplan validate):"
    grep -E 'ops\)|step time' "$out/v-$case.txt" || true
done
echo "load at end $(load); files in $out"
