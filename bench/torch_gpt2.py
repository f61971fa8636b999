"""bench/torch_gpt2.py: the GPT-2 zreal trains, in PyTorch on one GPU, for bench/gpu_race.sh to race.

The model is read from a zplan model file (default models/gpt2-124m.json) and built as zreal's
real_gpt builds it: pre-LN blocks, tanh GELU, fused qkv with biases, learned positions, the LM
head tied to the token embedding (no bias), no dropout, layer-norm eps 1e-5, GPT-2's init
(N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 L)), zero biases, unit gains). Training
is bf16 autocast over fp32 parameters (the fp32 master copy), AdamW betas (0.9, 0.95), eps
1e-8, no weight decay, as zreal trains; the 16 bytes per parameter of state match zreal's
(bf16 params and grads, fp32 master, m and v) in total if not in layout. Data are uniform
random tokens: throughput does not depend on them.

For each mode (eager, torch.compile) it prints one JSON line: tokens/s, step time, peak
memory (torch.cuda.max_memory_allocated) and the last loss.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


class Block(nn.Module):
    def __init__(self, hidden, heads, layers):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden, eps=1e-5)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-5)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)
        residual_std = 0.02 / math.sqrt(2 * layers)
        for linear, std in ((self.qkv, 0.02), (self.proj, residual_std), (self.fc1, 0.02),
                            (self.fc2, residual_std)):
            nn.init.normal_(linear.weight, 0.0, std)
            nn.init.zeros_(linear.bias)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.wte = nn.Embedding(m["vocab"], m["hidden"])
        self.wpe = nn.Embedding(m["seq_len"], m["hidden"])
        nn.init.normal_(self.wte.weight, 0.0, 0.02)
        nn.init.normal_(self.wpe.weight, 0.0, 0.02)
        self.blocks = nn.ModuleList(Block(m["hidden"], m["heads"], m["layers"])
                                    for _ in range(m["layers"]))
        self.lnf = nn.LayerNorm(m["hidden"], eps=1e-5)

    def forward(self, tokens, targets):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.lnf(x), self.wte.weight)  # the tied LM head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def run(mode, m, args):
    torch.manual_seed(1234)
    device = torch.device("cuda")
    model = GPT(m).to(device)
    params = sum(p.numel() for p in model.parameters())
    step_fn = torch.compile(model) if mode == "compile" else model
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.0, fused=True)
    shape = (args.micro_batch, m["seq_len"])
    tokens = torch.randint(0, m["vocab"], shape, device=device)
    targets = torch.randint(0, m["vocab"], shape, device=device)

    def step():
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = step_fn(tokens, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    torch.cuda.reset_peak_memory_stats()
    for _ in range(args.warmup):  # torch.compile compiles here; eager warms cuBLAS up
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    torch.cuda.synchronize()
    elapsed_s = time.perf_counter() - start
    if args.profile:  # the kernels of two more steps, by GPU time, on stderr
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(2):
                step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30,
                                        max_name_column_width=90), file=sys.stderr)
    result = {
        "system": "pytorch-" + mode,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "model": m["name"],
        "params": params,
        "micro_batch": args.micro_batch,
        "seq_len": m["seq_len"],
        "steps": args.steps,
        "step_time_s": elapsed_s / args.steps,
        "tokens_per_s": args.micro_batch * m["seq_len"] * args.steps / elapsed_s,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "loss": loss.item(),
    }
    del model, opt, step_fn
    torch.cuda.empty_cache()
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join(HERE, "..", "models", "gpt2-124m.json"))
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--modes", default="eager,compile")
    parser.add_argument("--profile", action="store_true",
                        help="print the GPU kernels of two further steps per mode on stderr")
    args = parser.parse_args()
    with open(args.model) as f:
        m = json.load(f)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 matmuls stay fp32, as zreal's
    for mode in args.modes.split(","):
        if mode not in ("eager", "compile"):
            parser.error("--modes: '%s' is neither eager nor compile" % mode)
        print(json.dumps(run(mode, m, args)), flush=True)


if __name__ == "__main__":
    main()
