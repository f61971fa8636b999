"""reports/gpu/generate.py: writes a GPU's README.md from the JSON beside it.

Predicted (zplan simulate on hwprofiles/GPU-measured.json) against measured (zreal --backend
cuda) for issue 20's grid, the calibration's microbenchmarks, the 7.5B emulated rank and, where
it was run, the race against PyTorch. Usage: python3 reports/gpu/generate.py [DIR] [--gpu GPU]
(default reports/gpu and h100; reports/gpu/h200 --gpu h200), or GPU=... sh bench/gpu_grid.sh
report. Standard library only; the same inputs give the same file.
"""
import glob
import json
import math
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GB = 1e9
TARGET_STEP, TARGET_PEAK = 0.10, 0.03
CATEGORIES = ["params", "grads", "master", "adam_m", "adam_v", "gathered_params", "buckets",
              "activations", "checkpoints", "workspace"]
# What each lent GPU was and how its folder was made; the rest of the page comes from the JSON.
GPUS = {
    "h100": {
        "title": "H100",
        "device": "one NVIDIA H100 80GB HBM3 (driver 580.159.04, CUDA 13.0, NCCL 2.28.9) lent "
                  "through the device tool, with `bench/gpu_session.sh` (build, `make gpu-test`'s "
                  "two programs, microbenchmarks, race, profile, 7.5B) and `bench/gpu_grid.sh "
                  "measure`",
        "emulate_profile": "`hwprofiles/dgx-h100.json` (the datasheet profile)",
    },
    "h200": {
        "title": "H200",
        "device": "one NVIDIA H200 (143,771 MiB, driver 580.159.04, CUDA 13.0, NCCL 2.28.9 from "
                  "PyTorch's wheel) lent through the device tool in two leases "
                  "([LEASES.md](LEASES.md)), with `bench/gpu_session.sh` (build, `make "
                  "gpu-test`'s programs, validation, the bf16 and fp32 microbenchmarks, 7.5B) and "
                  "`bench/gpu_grid.sh measure` (the configurations it reached in its time)",
        "emulate_profile": "`hwprofiles/h200-measured.json` (the calibrated profile above; "
                           "`mbN-datasheet-predicted.json` beside them are the datasheet "
                           "profile's, `hwprofiles/h200.json`)",
    },
}
OPS = ["embed_fwd", "block_fwd", "recompute", "head", "block_bwd", "embed_bwd", "optimizer",
       "allreduce", "reduce_scatter", "allgather"]


def load(path):
    with open(path) as f:
        return json.load(f)


def err(measured, predicted):
    return (measured - predicted) / predicted


def pct(x):
    return "%+.1f%%" % (100 * x)


def parse_name(name):
    """gpt2-124m-n1-s0-mb4-c1 -> (model, ranks, stage, micro_batch, checkpoint)."""
    parts = name.split("-")
    model = "-".join(parts[:-4])
    ranks, stage, micro, ckpt = parts[-4:]
    return model, int(ranks[1:]), int(stage[1:]), int(micro[2:]), ckpt == "c1"


def sort_key(name):
    model, ranks, stage, micro, ckpt = parse_name(name)
    return (model != "gpt2-124m", ranks, stage, micro, ckpt)


def device_peak(rank):
    """The driver's view: what the process held before its first allocation (context,
    cuBLAS) plus the most the allocation pool ever reserved."""
    dm = rank["device_memory"]
    return dm["context_bytes"] + dm["nccl_bytes"] + dm["pool_peak_reserved_bytes"]


def grid_rows(d):
    rows = []
    for path in sorted(glob.glob(os.path.join(d, "predicted", "*.json"))):
        name = os.path.basename(path)[:-5]
        p = load(path)
        mpath = os.path.join(d, "measured", name + ".json")
        log = os.path.join(d, "measured", name + ".log")
        row = {"name": name, "p": p, "m": None, "failure": None}
        if os.path.exists(mpath):
            row["m"] = load(mpath)
        elif os.path.exists(log):
            with open(log) as f:
                row["failure"] = f.read().strip().splitlines()[-1]
        rows.append(row)
    rows.sort(key=lambda r: sort_key(r["name"]))
    return rows


def grid_table(rows, out):
    out.append("| configuration | step predicted | step measured | error | peak predicted "
               "| peak measured (tracker) | error | device peak (driver) | model states "
               "| fits predicted |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        p, m = r["p"], r["m"]
        model, ranks, stage, micro, ckpt = parse_name(r["name"])
        label = "%s, %s, stage %d, mb %d%s" % (
            model, "1 GPU" if ranks == 1 else "rank 0 of %d (emulated)" % ranks, stage, micro,
            ", ckpt" if ckpt else "")
        fits = "yes" if p["fits_in_gpu_memory"] else "no"
        if m is None:
            out.append("| %s | %.1f ms | %s | | %.2f GB | | | | | %s |"
                       % (label, 1e3 * p["step_time_s"], r["failure"] or "not run",
                          p["peak_memory_bytes"] / GB, fits))
            continue
        rank = m["ranks"][0]
        states = "exact" if rank["model_state_bytes"] == p["model_state_bytes"] else pct(
            err(rank["model_state_bytes"], p["model_state_bytes"]))
        out.append("| %s | %.1f ms | %.1f ms | %s | %.2f GB | %.2f GB | %s | %.2f GB | %s | %s |"
                   % (label, 1e3 * p["step_time_s"], 1e3 * m["step_time_s"],
                      pct(err(m["step_time_s"], p["step_time_s"])), p["peak_memory_bytes"] / GB,
                      rank["peak_memory_bytes"] / GB,
                      pct(err(rank["peak_memory_bytes"], p["peak_memory_bytes"])),
                      device_peak(rank) / GB, states, fits))


def summary(rows, out):
    ran = [r for r in rows if r["m"]]
    failed = [r for r in rows if not r["m"] and r["failure"]]
    tried = ran + failed
    signed = [err(r["m"]["step_time_s"], r["p"]["step_time_s"]) for r in ran]
    step = [abs(e) for e in signed]
    peak = [abs(err(r["m"]["ranks"][0]["peak_memory_bytes"], r["p"]["peak_memory_bytes"]))
            for r in ran]
    exact = sum(r["m"]["ranks"][0]["model_state_bytes"] == r["p"]["model_state_bytes"]
                for r in ran)
    verdict_ok = sum(1 for r in tried if (r["m"] is not None) == r["p"]["fits_in_gpu_memory"])
    untried = len(rows) - len(tried)
    out.append("- %d configurations: %d ran, %d ran out of device memory%s."
               % (len(rows), len(ran), len(failed),
                  ", %d not run (the lease's time ran out)" % untried if untried else ""))
    out.append("- Fit verdict: right for %d of %d (every configuration predicted to fit ran, and "
               "every one predicted not to fit ran out of memory)." % (verdict_ok, len(tried))
               if verdict_ok == len(tried) else
               "- Fit verdict: right for %d of %d." % (verdict_ok, len(tried)))
    out.append("- Model-state bytes: exact in %d of %d." % (exact, len(ran)))
    slower = sum(e > 0 for e in signed)
    direction = ("measured slower in every case" if slower == len(signed) else
                 "measured faster in every case" if slower == 0 else
                 "measured slower in %d, faster in %d" % (slower, len(signed) - slower))
    out.append("- Step time: within %d%% in %d of %d; error median %.1f%%, range %.1f%% to "
               "%.1f%% (%s)."
               % (100 * TARGET_STEP, sum(e <= TARGET_STEP for e in step), len(ran),
                  100 * statistics.median(step), 100 * min(step), 100 * max(step), direction))
    out.append("- Peak memory (tracker): within %d%% in %d of %d; error median %.1f%%, range "
               "%.1f%% to %.1f%%."
               % (100 * TARGET_PEAK, sum(e <= TARGET_PEAK for e in peak), len(ran),
                  100 * statistics.median(peak), 100 * min(peak), 100 * max(peak)))


def ops_table(row, out):
    p, m = row["p"], row["m"]
    rank = m["ranks"][0]
    out.append("")
    out.append("`%s`: step %.1f ms predicted, %.1f ms measured." % (
        row["name"], 1e3 * p["step_time_s"], 1e3 * m["step_time_s"]))
    out.append("")
    out.append("| op (per step) | count | predicted | measured | error |")
    out.append("|---|---|---|---|---|")
    for op in OPS:
        po, mo = p["ops"].get(op), rank["ops"].get(op)
        if not po and not mo:
            continue
        pt = po["total_s"] if po else 0.0
        mt = mo["total_s"] if mo else 0.0
        out.append("| %s | %d | %.2f ms | %.2f ms | %s |" % (
            op, (po or mo)["count"], 1e3 * pt, 1e3 * mt, pct(err(mt, pt)) if pt > 0 else "n/a"))


def memory_table(row, out):
    p, m = row["p"], row["m"]
    rank = m["ranks"][0]
    out.append("")
    out.append("`%s`, each category's own peak:" % row["name"])
    out.append("")
    out.append("| category | predicted | measured | difference |")
    out.append("|---|---|---|---|")
    for c in CATEGORIES:
        pb, mb = p["category_peak_bytes"][c], rank["category_peak_bytes"][c]
        if pb == 0 and mb == 0:
            continue
        out.append("| %s | %.0f | %.0f | %s |" % (
            c, pb, mb, "exact" if pb == mb else "%+.0f bytes" % (mb - pb)))


def profile_section(d, gpu, out):
    prof = load(os.path.join(ROOT, "hwprofiles", "%s-measured.json" % gpu))
    cal = prof["calibration"]
    out.append("| constant | value | source |")
    out.append("|---|---|---|")
    for key, unit, scale in [("peak_bf16_flops", "TFLOP/s", 1e12),
                             ("peak_fp32_flops", "TFLOP/s", 1e12),
                             ("gemm_half_efficiency_flops", "GFLOP", 1e9),
                             ("hbm_bytes_per_s", "GB/s", 1e9),
                             ("elementwise_bytes_per_s", "GB/s (schedule bytes)", 1e9),
                             ("runtime_reserve_bytes", "GB", 1e9),
                             ("gpu_memory_bytes", "GB", 1e9)]:
        note = prof["notes"]["peak_fp16_flops" if key == "peak_bf16_flops" else key]
        out.append("| %s | %.1f %s | %s |" % (key, prof[key] / scale, unit,
                                               note.replace("|", "/")))
    out.append("")
    out.append("Fit residuals (RMS relative): GEMMs %.1f%%, fp32 GEMMs %.1f%%, Adam %.1f%%, block "
               "kernels %.1f%%, collectives %.1f%%." % (
                   100 * cal["gemm_rms_rel_error"], 100 * cal.get("fp32_gemm_rms_rel_error", 0),
                   100 * cal["memory_rms_rel_error"], 100 * cal["elementwise_rms_rel_error"],
                   100 * cal["collective_rms_rel_error"]))
    mb = load(os.path.join(d, "microbench", "microbench-%s-bf16.json" % gpu))
    out.append("")
    out.append("Model-shaped GEMMs at 16,384 tokens (bf16 backend, operand conversions "
               "included):")
    out.append("")
    out.append("| shape | form | m x n x k | time | TFLOP/s |")
    out.append("|---|---|---|---|---|")
    for g in mb["gemm"]:
        if 16384 in (g["m"], g["n"], g["k"]):
            out.append("| %s | %s | %d x %d x %d | %.3f ms | %.0f |" % (
                g["shape"], g["form"], g["m"], g["n"], g["k"], 1e3 * g["time_s"],
                g["flops"] / g["time_s"] / 1e12))
    out.append("")
    out.append("Memory-bound kernels at their largest size (bytes they really move; the four "
               "fitted ones also in the schedule's count):")
    out.append("")
    out.append("| kernel | elements | time | GB/s moved | FLOP rate |")
    out.append("|---|---|---|---|---|")
    biggest = {}
    for k in mb["memory"] + mb["kernels"]:
        size = k.get("elems", k.get("batch", 0) * k.get("heads", 0))
        if k["kernel"] not in biggest or size >= biggest[k["kernel"]][0]:
            biggest[k["kernel"]] = (size, k)
    for name, (size, k) in biggest.items():
        moved = k.get("device_bytes", k["bytes"])
        flops = "%.0f TFLOP/s" % (k["flops"] / k["time_s"] / 1e12) if "flops" in k else ""
        label = ("batch %d x %d heads" % (k["batch"], k["heads"])) if "batch" in k else (
            "%d" % k["elems"])
        out.append("| %s | %s | %.3f ms | %.0f | %s |" % (name, label, 1e3 * k["time_s"],
                                                         moved / k["time_s"] / 1e9, flops))


def attention_price(table, pas, flops, x, y, z):
    """A call's time as zp_optable_attention_s prices it: the pass's fixed time plus its FLOPs
    at the rate of its heads level (linear in log2 heads between levels, held beyond them);
    None off the grid's points."""
    att = table["eager_attention"]
    if x not in att["log2_seq"] or y not in att["log2_head_dim"]:
        return None
    i, j = att["log2_seq"].index(x), att["log2_head_dim"].index(y)
    levels = att.get("log2_heads")
    fixed = att.get("fixed_s", [table["launch_s"]] * 2)[pas == "backward"]
    if levels is None:
        return fixed + flops / att[pas][i][j]
    rates = [att[pas][lv][i][j] for lv in range(len(levels))]
    if z <= levels[0]:
        rate = rates[0]
    elif z >= levels[-1]:
        rate = rates[-1]
    else:
        k = max(n for n in range(len(levels) - 1) if levels[n] <= z)
        f = (z - levels[k]) / (levels[k + 1] - levels[k])
        rate = rates[k] + f * (rates[k + 1] - rates[k])
    return fixed + flops / rate


def attention_section(d, gpu, out):
    """The op table's eager attention (timed at batch 1 of 8 heads) against the model-shaped
    attention kernels the same microbenchmark timed."""
    prof = load(os.path.join(ROOT, "hwprofiles", "%s-measured.json" % gpu))
    table = prof.get("op_costs")
    if not table or "eager_attention" not in table:
        return
    mb = load(os.path.join(d, "microbench", "microbench-%s-bf16.json" % gpu))
    rows = []
    for k in mb["kernels"]:
        if k["kernel"] not in ("attention_fwd", "attention_bwd"):
            continue
        pas = "backward" if k["kernel"] == "attention_bwd" else "forward"
        t = attention_price(table, pas, k["flops"], math.log2(k["seq_len"]),
                            math.log2(k["head_dim"]), math.log2(k["heads"]))
        if t is None:
            continue
        rows.append("| %s | %d x %d heads | %d / %d | %.3f ms | %.3f ms | %s |" % (
            pas, k["batch"], k["heads"], k["seq_len"], k["head_dim"], 1e3 * k["time_s"],
            1e3 * t, pct(err(t, k["time_s"]))))
    if not rows:
        return
    out.append("")
    att = table["eager_attention"]
    levels = " and ".join("%d" % 2 ** z for z in att.get("log2_heads", [3]))
    fixed = att.get("fixed_s", [table["launch_s"]] * 2)
    out.append("Eager attention: the op table prices a call as its pass's fixed time (forward "
               "%.1f us, backward %.1f us) plus its samples one after another, each at the "
               "rate its (sequence, head dimension) point was timed at, at batch 1 of %s heads "
               "(real_opbench.c, `bench_attention_grid`; zp_optable_attention_s). The "
               "model-shaped kernels the same run timed (`kernels`) against that price, "
               "error = (table - measured) / measured:"
               % (1e6 * fixed[0], 1e6 * fixed[1], levels))
    out.append("")
    out.append("| pass | batch x heads | seq / head dim | measured | op table | error |")
    out.append("|---|---|---|---|---|---|")
    out.extend(rows)


def emulate_section(d, out):
    for mb in (1, 4):
        p = load(os.path.join(d, "emulate-7.5b", "mb%d-predicted.json" % mb))
        m = load(os.path.join(d, "emulate-7.5b", "mb%d-measured.json" % mb))
        rank = m["ranks"][0]
        psi = p["model_state_bytes"]
        out.append("- micro-batch %d: model states %d bytes measured, %d predicted (%s); "
                   "peak %.2f GB measured by the tracker, %.2f GB predicted (%s), %.2f GB on the "
                   "driver (context and pool peak); step %.3f s measured, %.3f s predicted (%s)."
                   % (mb, rank["model_state_bytes"], psi,
                      "exact" if rank["model_state_bytes"] == psi else "differ",
                      rank["peak_memory_bytes"] / GB, p["peak_memory_bytes"] / GB,
                      pct(err(rank["peak_memory_bytes"], p["peak_memory_bytes"])),
                      device_peak(rank) / GB, m["step_time_s"], p["step_time_s"],
                      pct(err(m["step_time_s"], p["step_time_s"]))))
        out.append("  Workspace: %.2f GB measured against %.2f GB predicted."
                   % (rank["category_peak_bytes"]["workspace"] / GB,
                      p["category_peak_bytes"]["workspace"] / GB))


def race_section(d, out):
    with open(os.path.join(d, "race", "race.txt")) as f:
        out.append("```")
        out.extend(line.rstrip() for line in f)
        out.append("```")
    out.append("")
    out.append("zreal's kernels in one step (Nsight Compute, `race/zreal-kernels.tsv`), the "
               "largest ten:")
    out.append("")
    out.append("| kernel | launches | ms |")
    out.append("|---|---|---|")
    with open(os.path.join(d, "race", "zreal-kernels.tsv")) as f:
        lines = f.read().splitlines()[1:]
    total = sum(float(line.split("\t")[2]) for line in lines)
    for line in lines[:10]:
        name, launches, ns = line.split("\t")
        out.append("| `%s` | %s | %.2f |" % (name[:90], launches, float(ns) / 1e6))
    out.append("| all %d kinds | %d | %.2f |" % (
        len(lines), sum(int(line.split("\t")[1]) for line in lines), total / 1e6))


TIME_NOTE_ROOFLINE = (
    "The simulator costs a block as FLOPs at the fitted GEMM rate plus the schedule's "
    "memory-bound bytes at the fitted block-kernel rate, and its forward at half its "
    "backward. zreal's forward is nearly as long as its backward: it rounds every "
    "activation to bf16 and stores it, converts each fp32 GEMM operand to bf16 "
    "(cuBLAS's tensor cores need both operands in bf16), and writes the s x s scores "
    "and probabilities of eager attention, traffic the schedule's byte count does not "
    "hold (see the race's kernel table).")
TIME_NOTE_OPTABLE = (
    "The profile has an op table (`op_costs`): zp_cost prices each op as the kernels zreal "
    "issues for it (zp_cost_kernels): every GEMM at its exact shape where the microbenchmark "
    "timed it, else on the GEMM grid; eager attention a fixed time per call plus each sample "
    "at its heads level's rate; each elementwise kernel by its bytes at its class's rate; a "
    "kernel's fixed cost in a stream each. Where it still misses, op by op, and why: the "
    "attention table above and [LEASES.md](LEASES.md).")


def parse_args(argv):
    d, gpu = os.path.join(ROOT, "reports", "gpu"), "h100"
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--gpu" and args:
            gpu = args.pop(0)
        elif a.startswith("-"):
            sys.exit("generate.py: usage: generate.py [DIR] [--gpu %s]" % "|".join(GPUS))
        else:
            d = a
    if gpu not in GPUS:
        sys.exit("generate.py: --gpu: '%s' is not one of %s" % (gpu, ", ".join(GPUS)))
    return d, gpu


def main():
    d, gpu = parse_args(sys.argv[1:])
    g = GPUS[gpu]
    rows = grid_rows(d)
    prof_path = "hwprofiles/%s-measured.json" % gpu
    has_table = "op_costs" in load(os.path.join(ROOT, prof_path))
    out = ["# zreal on one %s: predicted against measured" % g["title"], "",
           "Generated by `reports/gpu/generate.py` from the JSON in this folder (`GPU=%s sh "
           "bench/gpu_grid.sh report`); do not edit by hand. Measured on %s. "
           "Predictions: `bench/gpu_grid.sh predict`, `zplan simulate --cluster "
           "%s --precision bf16 --no-dropout`, on a profile fitted "
           "by `zplan calibrate` from `microbench/` alone: no constant was set from a "
           "training run." % (gpu, g["device"], prof_path), "",
           "Stages 0 to 3 on one GPU differ in layout only; `rank 0 of N (emulated)` is "
           "`zreal --emulate N`: one process holds exactly rank 0's partitions and buffers, "
           "and collectives are device-to-device copies of the sizes the real ones deliver. "
           "Step time is the mean of the steps after the first. The tracker counts every "
           "buffer zreal allocates; the driver's peak adds the CUDA context and the pool's "
           "slack.", "", "## Summary", ""]
    summary(rows, out)
    out += ["", "## The calibrated profile (`%s`)" % prof_path, ""]
    profile_section(d, gpu, out)
    attention_section(d, gpu, out)
    out += ["", "## Every configuration", ""]
    grid_table(rows, out)
    out += ["", "## Where the time goes, by op", "",
            TIME_NOTE_OPTABLE if has_table else TIME_NOTE_ROOFLINE]
    for name in ["gpt2-124m-n1-s0-mb16-c0", "gpt2-124m-n1-s3-mb4-c1",
                 "gpt2-1.5b-n1-s0-mb4-c0", "gpt2-1.5b-n64-s3-mb4-c1"]:
        row = next((r for r in rows if r["name"] == name and r["m"]), None)
        if row:
            ops_table(row, out)
    out += ["", "## Memory, by category", "",
            "Model states, gathered parameters and buckets are the planner's to the byte; "
            "activations differ by the fp32 layer-norm statistics (16 bytes a token a layer) "
            "the formula leaves out; workspace holds what the schedule does not list: the bf16 "
            "copy of the fp32 logits that the LM head's GEMMs read, the padded output band of "
            "the head's GEMM, and attention's per-sample score tiles."]
    for name in ["gpt2-124m-n1-s0-mb16-c0", "gpt2-1.5b-n1-s3-mb4-c1"]:
        row = next((r for r in rows if r["name"] == name and r["m"]), None)
        if row:
            memory_table(row, out)
    out += ["", "## The 7.5B model, rank 0 of 64 emulated, stage 3, checkpointing", "",
            "`zplan simulate` on %s against "
            "`zreal --backend cuda --emulate 64 --rank 0`:" % g["emulate_profile"], ""]
    emulate_section(d, out)
    if os.path.isdir(os.path.join(d, "race")):
        out += ["", "## Race: GPT-2 124M, micro-batch 8 x 1,024 tokens, bf16, one GPU", "",
                "`sh bench/gpu_race.sh 8 10`. PyTorch eager runs SDPA (cuDNN's FlashAttention "
                "on Hopper), and its tied-head GEMMs go through cuBLAS's align1 kernels "
                "(`race/torch-eager-kernels.txt`, two steps)."]
        race_section(d, out)
    path = os.path.join(d, "README.md")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(out) + "\n")
    os.replace(path + ".tmp", path)
    print("wrote %s: %d configurations" % (path, len(rows)))


if __name__ == "__main__":
    main()
