#!/bin/sh
# reports/zeror_zeropp.sh: the ZeRO paper's ZeRO-R configurations C1-C5 (section 10.4: 400
# V100s, MP 16, micro-batch 16 per data-parallel rank) with the largest model each fits, and a
# gpt-1t ZeRO-3 step on 1,024 dgx-a100-80g GPUs with and without each ZeRO++ technique.
#
# Usage: reports/zeror_zeropp.sh [PATH/TO/zplan]   (default: build/zplan)
set -eu

cd "$(dirname "$0")/.."
ZPLAN=${1:-build/zplan}
[ -x "$ZPLAN" ] || { echo "zeror_zeropp.sh: $ZPLAN is not built (run make)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# A GPT-2-style model of L blocks at the 100B model's width (hidden 8192, 64 heads,
# sequence 1024): 12h^2 + 13h = 805.4M parameters a block.
model() {
    printf '{"name": "h8192-L%d", "layers": %d, "hidden": 8192, "heads": 64, "seq_len": 1024, "vocab": 50257}\n' \
        "$1" "$1" >"$tmp/model.json"
}

# fits L FLAGS...: zplan simulate's verdict (exit 0: fits, 2: does not).
fits() {
    layers=$1
    shift
    model "$layers"
    "$ZPLAN" simulate --model "$tmp/model.json" --cluster dgx2-v100 --gpus 400 --mp 16 \
        --micro-batch 16 --checkpoint "$@" >"$tmp/out.txt" 2>&1
}

# The most blocks that fit, by bisection (fitting is monotone in the depth).
largest() {
    lo=1
    hi=600
    while [ $((hi - lo)) -gt 1 ]; do
        mid=$(((lo + hi) / 2))
        if fits "$mid" "$@"; then lo=$mid; else hi=$mid; fi
    done
    fits "$lo" "$@" || true
    echo "$lo"
}

echo "ZeRO-R on 400 x V100-32GB (dgx2-v100), MP 16, DP 25, micro-batch 16, checkpointing:"
for c in "C1 --stage 1 --contiguous-memory" \
         "C2 --stage 1 --contiguous-memory --partition-activations" \
         "C3 --stage 2 --contiguous-memory" \
         "C4 --stage 2 --contiguous-memory --partition-activations" \
         "C5 --stage 2 --contiguous-memory --partition-activations --cpu-checkpointing"; do
    name=${c%% *}
    flags=${c#* }
    # shellcheck disable=SC2086
    layers=$(largest $flags)
    params=$(awk -v l="$layers" 'BEGIN { printf "%.1f", (l * (12 * 8192 * 8192 + 13 * 8192) + (50257 + 1024) * 8192 + 2 * 8192) / 1e9 }')
    printf '  %s (%s): %d blocks, %sB parameters\n' "$name" "$flags" "$layers" "$params"
    sed -n '1p; /step time/p; /caching allocator/p' "$tmp/out.txt" | sed 's/^ */    /'
done

echo
echo "gpt-1t, ZeRO-3 on 1,024 x A100-80GB (dgx-a100-80g), micro-batch 1, checkpointing:"
for z in "" "--quantized-weights" "--hpz-partition-size 8" "--quantized-gradients" \
         "--quantized-weights --hpz-partition-size 8 --quantized-gradients"; do
    # shellcheck disable=SC2086
    "$ZPLAN" simulate --model gpt-1t --cluster dgx-a100-80g --gpus 1024 --stage 3 \
        --micro-batch 1 --checkpoint $z >"$tmp/out.txt" 2>&1 || true
    echo "  ${z:-plain ZeRO-3}:"
    sed -n '1p; /step time/p; /exposed communication/p; /bytes sent/p; /ZeRO++ subgroups/p' \
        "$tmp/out.txt" | sed 's/^ */    /'
done
