#!/bin/sh
# reports/generate.sh: regenerates reports/ — README.md with the ZeRO paper's Tables 1 and 2
# beside zplan's numbers, and the plots — from zplan's own output. Run by `make reports`.
#
# Usage: reports/generate.sh [PATH/TO/zplan]   (default: build/zplan)
set -eu

cd "$(dirname "$0")/.."
ZPLAN=${1:-build/zplan}
OUT=reports
GPUS=1,2,4,8,16,32,64,128,256,512,1024
[ -x "$ZPLAN" ] || { echo "generate.sh: $ZPLAN is not built (run make)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Table 1: model-state bytes per GPU for the paper's three sizes.
for size in 7.5e9 128e9 1e12; do
    "$ZPLAN" memory --params "$size" --gpus 1,4,16,64,256,1024 --json >"$tmp/table1-$size.json"
done
# Table 2: the largest model whose states fit in 32e9 bytes, DP 64, MP 1 to 16.
for mp in 1 2 4 8 16; do
    "$ZPLAN" maxmodel --gpu-memory 32e9 --gpus $((64 * mp)) --mp "$mp" --json >"$tmp/table2-$mp.json"
done

# A Perfetto trace: gpt2-1.5b under ZeRO-3 on 64 V100s, with prefetched all-gathers beside
# the forward compute (open it at ui.perfetto.dev).
"$ZPLAN" simulate --model gpt2-1.5b --cluster dgx2-v100 --gpus 64 --stage 3 --micro-batch 8 \
    --checkpoint --trace "$OUT/trace-gpt2-1.5b-zero3-64.json" >"$tmp/trace-summary.txt"

# Plots (each writes NAME.csv and NAME.svg atomically).
"$ZPLAN" sweep --vary gpus --values "$GPUS" --model gpt-7.5b --cluster dgx2-v100 \
    --metric memory --checkpoint --out "$OUT/memory-gpt-7.5b"
"$ZPLAN" sweep --vary gpus --values "$GPUS" --cluster dgx2-v100 --metric maxmodel \
    --out "$OUT/maxmodel-dgx2-v100"
"$ZPLAN" sweep --vary gpus --values 64,128,256,512,1024 --model gpt-60b --cluster dgx2-v100 \
    --metric tflops --out "$OUT/tflops-gpt-60b"

"$ZPLAN" plan --model gpt3-175b --cluster dgx-a100-80g --gpus 256 --global-batch 1536 \
    --top 3 >"$tmp/plan.txt"

perl - "$tmp" >"$OUT/README.md.tmp" <<'PERL'
use strict;
use warnings;
use JSON::PP;

my $dir = shift;
sub load { local $/; open my $f, '<', "$dir/$_[0]" or die "$_[0]: $!"; decode_json(<$f>) }

# The paper's values as printed (shared/reference/field-facts.md): Table 1 in GB per GPU for
# stages 1-3 (Pos, Pos+g, Pos+g+p), one row per DP degree.
my %paper1 = (
    '7.5e9' => [[120, 120, 120], [52.5, 41.3, 30], [35.6, 21.6, 7.5], [31.4, 16.6, 1.88],
                [30.4, 15.4, 0.47], [30.1, 15.1, 0.12]],
    '128e9' => [[2048, 2048, 2048], [896, 704, 512], [608, 368, 128], [536, 284, 32],
                [518, 263, 8], [513, 257, 2]],
    '1e12' => [[16000, 16000, 16000], [7000, 5500, 4000], [4750, 2875, 1000],
               [4187, 2218, 250], [4046, 2054, 62.5], [4011, 2013, 15.6]],
);
my %label = ('7.5e9' => '7.5B', '128e9' => '128B', '1e12' => '1T');

# The paper rounds 7.5B to three figures and truncates 128B and 1T; a cell agrees when zplan's
# exact value, rounded or truncated to the decimals the paper printed, is the paper's value.
sub decimals { my ($s) = @_; $s =~ /\.(\d+)$/ ? length $1 : 0 }
sub agrees {
    my ($z, $p) = @_;
    my $d = decimals($p);
    my $scale = 10**$d;
    my $rounded = int($z * $scale + 0.5) / $scale; # half up, as printed tables round
    my $truncated = int($z * $scale + 1e-9) / $scale;
    return abs($rounded - $p) < 1e-9 || abs($truncated - $p) < 1e-9;
}
sub fig { sprintf('%.6g', $_[0]) }

my ($cells, $agree) = (0, 0);
my $t1 = '';
for my $size ('7.5e9', '128e9', '1e12') {
    my $j = load("table1-$size.json");
    $t1 .= "\n**$label{$size}** (GB per GPU; paper / zplan)\n\n";
    $t1 .= "| DP | Pos paper | Pos zplan | Pos+g paper | Pos+g zplan | Pos+g+p paper | Pos+g+p zplan |\n";
    $t1 .= "|---:|---:|---:|---:|---:|---:|---:|\n";
    my $i = 0;
    for my $row (@{$j->{rows}}) {
        $t1 .= "| $row->{dp} ";
        for my $stage (1 .. 3) {
            my $z = $row->{"stage$stage"} / 1e9;
            my $p = $paper1{$size}[$i][$stage - 1];
            my $ok = agrees($z, $p);
            $cells++;
            $agree += $ok;
            $t1 .= "| $p | " . fig($z) . ($ok ? '' : ' ✗') . ' ';
        }
        $t1 .= "|\n";
        $i++;
    }
}

# Table 2: the paper multiplies its (rounded) MP-1 row by MP.
my @paper2 = (['2B', '7.6B', '14.4B', '128B'], ['4B', '15.2B', '28.8B', '256B'],
              ['8B', '30.4B', '57.6B', '0.5T'], ['16B', '60.8B', '115.2B', '1T'],
              ['32B', '121.6B', '230.4B', '2T']);
sub size { my ($p) = @_; $p >= 1e12 ? sprintf('%.4gT', $p / 1e12) : sprintf('%.4gB', $p / 1e9) }
my $t2 = "| MP | GPUs | Baseline paper | zplan | Pos paper | zplan | Pos+g paper | zplan | Pos+g+p paper | zplan |\n";
$t2 .= "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
my $r = 0;
for my $mp (1, 2, 4, 8, 16) {
    my $j = load("table2-$mp.json");
    $t2 .= "| $mp | $j->{gpus} ";
    $t2 .= "| $paper2[$r][$_] | " . size($j->{"stage$_"}) . ' ' for 0 .. 3;
    $t2 .= "|\n";
    $r++;
}

my $plan = do { local $/; open my $f, '<', "$dir/plan.txt" or die; <$f> };
my $trace = do { local $/; open my $f, '<', "$dir/trace-summary.txt" or die; <$f> };

print <<"MD";
# zplan reports

Generated by `make reports` (reports/generate.sh) from `build/zplan`; do not edit by hand.
GB = 1e9 bytes, B = 1e9 and T = 1e12 parameters, as in the ZeRO paper (arXiv 1910.02054).

## Table 1: model-state memory per GPU

Mixed-precision Adam, K = 12: 16 bytes per parameter without ZeRO, 4 + 12/N with Pos,
2 + 14/N with Pos+g, 16/N with Pos+g+p (`zplan memory --params P --gpus N --json`). zplan's
figures are exact; $agree of $cells cells agree with the paper at the precision it printed
(7.5B rounded to three figures, 128B and 1T truncated; ✗ marks a cell that does not).
$t1
## Table 2: the largest model whose model states fit (32e9 bytes per GPU, DP 64)

`zplan maxmodel --gpu-memory 32e9 --gpus 64×MP --mp MP`: exact per MP, where the paper
multiplies its rounded MP-1 row by MP (7.6B × 16 = 121.6B against zplan's 122.3B).

$t2
## Memory per GPU against GPU count, 7.5B

![memory per GPU of gpt-7.5b by stage](memory-gpt-7.5b.svg)

models/gpt-7.5b.json on dgx2-v100 (`zplan sweep --vary gpus --metric memory --checkpoint`):
model states plus activations with checkpointing at micro-batch 1, DeepSpeed's default
buckets and the 1 GB runtime reserve, against the V100's 32 GiB. Stages 0-2 flatten out at
their replicated states (16, 4 and 2 bytes per parameter); stage 3 keeps falling as 16/N
until buffers and activations dominate. Data: memory-gpt-7.5b.csv.

## The largest trainable model against GPU count, dgx2-v100

![largest model per stage](maxmodel-dgx2-v100.svg)

The largest parameter count whose model states fit in a V100's 32 GiB less the 1 GB runtime
reserve, MP 1 (`zplan sweep --vary gpus --metric maxmodel`). Only stage 3 grows with N without
bound; stages 1 and 2 approach 4 and 2 bytes per parameter. Data: maxmodel-dgx2-v100.csv.

## TFLOP/s per GPU against GPU count, 60B

![TFLOP/s per GPU of gpt-60b](tflops-gpt-60b.svg)

models/gpt-60b.json on dgx2-v100: at each GPU count, `zplan plan`'s search (stage, TP degree,
micro-batch, checkpointing, buckets; free global batch) and the simulated model TFLOP/s per
GPU (recomputation not counted) of the best plan of each stage; a stage with no point has no
plan that fits. Data: tflops-gpt-60b.csv.

## A simulated step in Perfetto: gpt2-1.5b, ZeRO-3, 64 V100s

[trace-gpt2-1.5b-zero3-64.json](trace-gpt2-1.5b-zero3-64.json) is Chrome trace-event JSON:
open it at ui.perfetto.dev. One process stands for the 64 identical ranks; its compute,
dp-comm and tp-comm tracks show each unit's all-gather issued ahead of the forward op that
uses it (stage3_prefetch_bucket_size 5e7 covers the next 31M-parameter block), and a counter
track shows memory by category.

```
\$ zplan simulate --model gpt2-1.5b --cluster dgx2-v100 --gpus 64 --stage 3 --micro-batch 8 --checkpoint
$trace```

## A plan: GPT-3 175B on 256 A100s, global batch 1536

```
\$ zplan plan --model gpt3-175b --cluster dgx-a100-80g --gpus 256 --global-batch 1536 --top 3
$plan```
MD
PERL
mv "$OUT/README.md.tmp" "$OUT/README.md"
echo "reports: wrote $OUT/README.md and $(ls "$OUT"/*.svg | wc -l) plots"
