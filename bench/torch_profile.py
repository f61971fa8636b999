"""bench/torch_profile.py: a few training steps of a GPT-2 or Llama block stack under torch.profiler.

Writes, for `zplan calibrate --torch-trace` and `zplan validate --torch-trace`:
  OUT/trace-rank<R>.json.gz  Kineto's Chrome-trace JSON of the profiled steps, one per rank
  OUT/steps-rank<R>.json     the configuration, each step's time, and peak memory
                             (torch.cuda.max_memory_allocated and max_memory_reserved)

The model is read from a zplan model file (models/gpt2-124m.json, models/llama-tiny.json, ...)
so that zplan predicts the very configuration that ran: GPT-2 blocks (pre-LN, fused qkv with
biases, tanh GELU, learned positions, tied head) or, when the file says "mlp": "swiglu", Llama
blocks (RMSNorm, grouped-query attention, rotary embeddings, SwiGLU, untied head, no biases),
as Hugging Face's GPT2Block and LlamaDecoderLayer compute them. No dropout. Training is bf16
autocast over fp32 parameters with fused AdamW. Tokens are uniform random: throughput does not
depend on them.

One GPU:  python3 bench/torch_profile.py --model models/gpt2-124m.json --micro-batch 8 --out o
FSDP:     torchrun --nproc-per-node 8 bench/torch_profile.py --fsdp ... (FULL_SHARD, i.e. ZeRO-3;
          --fsdp-sharding shard-grad-op for ZeRO-2)

The profiler settings are those docs/calibrate.md gives: CPU and CUDA activities,
record_shapes=True (the GEMMs' m, n, k reach zplan through the CPU ops' input shapes),
schedule(wait=1, warmup=1, active=--steps), and no stacks or memory events (they add time).
"""
import argparse
import json
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, schedule

HERE = os.path.dirname(os.path.abspath(__file__))
ATTENTION = {  # --attention: the SDPA backend PyTorch may use
    "sdpa": None,  # PyTorch's own choice
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}


def rotary(x, cos, sin):
    """Hugging Face's apply_rotary_pos_emb: rotate_half on [b, heads, s, d], in x's dtype (the
    linear's bf16 under autocast), so that q, k and v reach attention in one dtype."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, m, llama):
        super().__init__()
        self.heads = m["heads"]
        self.kv_heads = m.get("kv_heads", self.heads) if llama else self.heads
        self.head_dim = m["hidden"] // self.heads
        width = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.qkv = nn.Linear(m["hidden"], width, bias=not llama)
        self.proj = nn.Linear(m["hidden"], m["hidden"], bias=not llama)
        self.llama = llama

    def forward(self, x, rope):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split([self.heads * self.head_dim,
                                     self.kv_heads * self.head_dim,
                                     self.kv_heads * self.head_dim], dim=2)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.llama:
            q, k = rotary(q, *rope), rotary(k, *rope)
            if self.kv_heads != self.heads:  # Hugging Face's repeat_kv
                k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
                v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(a.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, m, llama):
        super().__init__()
        h = m["hidden"]
        norm = (lambda: nn.RMSNorm(h, eps=m.get("norm_eps", 1e-5))) if llama else \
               (lambda: nn.LayerNorm(h, eps=1e-5))
        self.norm1, self.norm2 = norm(), norm()
        self.attn = Attention(m, llama)
        self.llama = llama
        ffn = m.get("ffn_hidden", 4 * h)
        if llama:
            self.gate = nn.Linear(h, ffn, bias=False)
            self.up = nn.Linear(h, ffn, bias=False)
            self.down = nn.Linear(ffn, h, bias=False)
        else:
            self.fc1 = nn.Linear(h, ffn)
            self.fc2 = nn.Linear(ffn, h)

    def forward(self, x, rope):
        x = x + self.attn(self.norm1(x), rope)
        y = self.norm2(x)
        if self.llama:
            return x + self.down(F.silu(self.gate(y)) * self.up(y))
        return x + self.fc2(F.gelu(self.fc1(y), approximate="tanh"))


class Model(nn.Module):
    def __init__(self, m, seq):
        super().__init__()
        self.llama = m.get("mlp") == "swiglu"
        h, v = m["hidden"], m["vocab"]
        self.wte = nn.Embedding(v, h)
        self.wpe = None if self.llama else nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(Block(m, self.llama) for _ in range(m["layers"]))
        self.norm = nn.RMSNorm(h, eps=m.get("norm_eps", 1e-5)) if self.llama else \
            nn.LayerNorm(h, eps=1e-5)
        self.head = nn.Linear(h, v, bias=False) if self.llama else None  # GPT-2 ties it
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
        head_dim = h // m["heads"]
        inv = 1.0 / (m.get("rope_theta", 10000.0) **
                     (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens, targets):
        x = self.wte(tokens)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        rope = (self.cos.to(x.dtype), self.sin.to(x.dtype))
        for block in self.blocks:
            x = block(x, rope)
        x = self.norm(x)
        logits = self.head(x) if self.head is not None else F.linear(x, self.wte.weight)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def wrap_fsdp(model, blocks, sharding, device):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    strategy = {"full-shard": ShardingStrategy.FULL_SHARD,
                "shard-grad-op": ShardingStrategy.SHARD_GRAD_OP,
                "no-shard": ShardingStrategy.NO_SHARD}[sharding]
    return FSDP(model, auto_wrap_policy=ModuleWrapPolicy({type(blocks[0])}),
                sharding_strategy=strategy, device_id=device, use_orig_params=True,
                mixed_precision=MixedPrecision(param_dtype=torch.bfloat16,
                                               reduce_dtype=torch.bfloat16,
                                               buffer_dtype=torch.bfloat16))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join(HERE, "..", "models", "gpt2-124m.json"),
                        help="a zplan model file (GPT-2 blocks, or Llama's with mlp: swiglu)")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=None, help="default: the model's seq_len")
    parser.add_argument("--attention", choices=sorted(ATTENTION), default="sdpa")
    parser.add_argument("--fsdp", action="store_true", help="wrap each block in FSDP (torchrun)")
    parser.add_argument("--fsdp-sharding", default="full-shard",
                        choices=["full-shard", "shard-grad-op", "no-shard"])
    parser.add_argument("--steps", type=int, default=3, help="profiled steps")
    parser.add_argument("--warmup", type=int, default=3, help="unprofiled steps first")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--out", default="torch-profile", help="output folder")
    args = parser.parse_args()
    if args.micro_batch < 1 or args.steps < 1 or args.warmup < 0:
        parser.error("--micro-batch and --steps must be at least 1, --warmup at least 0")
    with open(args.model) as f:
        m = json.load(f)
    seq = args.seq or m["seq_len"]

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.fsdp and world > 1:
        dist.init_process_group("nccl")
    elif args.fsdp:
        parser.error("--fsdp: launch with torchrun --nproc-per-node N (N > 1)")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    torch.manual_seed(1234 + rank)
    torch.backends.cuda.matmul.allow_tf32 = False

    model = Model(m, seq).to(device)
    params = sum(p.numel() for p in model.parameters())
    if args.fsdp:
        model = wrap_fsdp(model, model.blocks, args.fsdp_sharding, device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.0, fused=True)
    tokens = torch.randint(0, m["vocab"], (args.micro_batch, seq), device=device)
    targets = torch.randint(0, m["vocab"], (args.micro_batch, seq), device=device)
    backend = ATTENTION[args.attention]

    def step():
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            if backend is None:
                loss = model(tokens, targets)
            else:
                from torch.nn.attention import SDPBackend, sdpa_kernel
                with sdpa_kernel(getattr(SDPBackend, backend)):
                    loss = model(tokens, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    os.makedirs(args.out, exist_ok=True)
    trace = os.path.join(args.out, "trace-rank%d.json.gz" % rank)
    step_s = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=schedule(wait=1, warmup=1, active=args.steps, repeat=1),
                 record_shapes=True, with_stack=False, profile_memory=False,
                 on_trace_ready=lambda p: p.export_chrome_trace(trace)) as prof:
        for i in range(2 + args.steps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            loss = step()
            torch.cuda.synchronize()
            if i >= 2:  # the profiled (active) steps
                step_s.append(time.perf_counter() - start)
            prof.step()
    result = {
        "format": "zplan-torch-profile-1",
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device),
        "model": m["name"],
        "params": params,
        "arch": "llama" if model_is_llama(m) else "gpt2",
        "micro_batch": args.micro_batch,
        "seq": seq,
        "attention": args.attention,
        "precision": "bf16",
        "fsdp": args.fsdp_sharding if args.fsdp else None,
        "world": world,
        "rank": rank,
        "trace": os.path.basename(trace),
        "step_time_s": step_s,
        "median_step_time_s": sorted(step_s)[len(step_s) // 2],
        "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(device),
        "max_memory_reserved_bytes": torch.cuda.max_memory_reserved(device),
        "loss": loss.item(),
    }
    with open(os.path.join(args.out, "steps-rank%d.json" % rank), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("rank", "median_step_time_s",
                                             "max_memory_reserved_bytes")}))
    if args.fsdp:
        dist.destroy_process_group()
    assert math.isfinite(result["loss"]), "the loss diverged"


def model_is_llama(m):
    return m.get("mlp") == "swiglu"


if __name__ == "__main__":
    main()
