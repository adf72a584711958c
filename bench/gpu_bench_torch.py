#!/usr/bin/env python3
"""PyTorch baseline for bench/gpu_bench.sh: GPT-2 training speed on the same GPU and config.

The strongest stock PyTorch recipe for this model: torch.compile, bf16 autocast, fused AdamW,
scaled_dot_product_attention (flash attention on Hopper), TF32 allowed, vocabulary padded to a
multiple of 128 (as the longhaul backend does internally), tied embeddings. One step is the same
as longhaul's: zero_grad, forward + backward of one micro-batch, global-norm clipping at 1.0,
AdamW step. MFU uses the same FLOPs per token, 6 N + 6 L C T with N = the parameter count at the
real vocabulary (124,439,808 for GPT-2 124M), and the same peak.

Prints a table row and a `RESULT impl=pytorch ...` line. If the requested micro-batch does not fit,
halves it until it does (the row says which B ran).

    python3 bench/gpu_bench_torch.py --batch 16 --seq-len 1024 --steps 20
"""
import argparse
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {
    # vocab, context, layers, heads, channels (as worker/model/config.h)
    "gpt2-124m": (50257, 1024, 12, 12, 768),
    "gpt2-350m": (50257, 1024, 24, 16, 1024),
    "tiny": (256, 128, 4, 4, 128),
}


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.n_head = NH
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, V, maxT, L, NH, C):
        super().__init__()
        Vp = (V + 127) // 128 * 128
        self.wte = nn.Embedding(Vp, C)
        self.wpe = nn.Embedding(maxT, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, Vp, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def run(args, B):
    V, maxT, L, NH, C = PRESETS[args.preset]
    T = args.seq_len
    torch.manual_seed(0)
    model = GPT(V, maxT, L, NH, C).cuda()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    compiled = torch.compile(model)
    x = torch.randint(0, V, (B, T), device="cuda")
    y = torch.randint(0, V, (B, T), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = compiled(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    for _ in range(args.warmup):
        loss = step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    start = time.perf_counter()
    for _ in range(args.steps):
        s = time.perf_counter()
        loss = step()
        loss.item()  # synchronise each step, as the longhaul loop does when it reads the loss
        times.append((time.perf_counter() - s) * 1e3)
    torch.cuda.synchronize()
    total_ms = (time.perf_counter() - start) * 1e3
    n_params = V * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C
    ms_per_step = total_ms / args.steps
    tokens_per_s = B * T / (ms_per_step / 1e3)
    mfu = tokens_per_s * (6 * n_params + 6 * L * C * T) / (args.peak_tflops * 1e12)
    mem_gib = torch.cuda.max_memory_reserved() / 2**30
    times.sort()
    print(f"{'pytorch':<10} {B:6d} {T:6d} {tokens_per_s:12.0f} {ms_per_step:10.2f} "
          f"{times[len(times) // 2]:10.2f} {100 * mfu:7.1f}% {mem_gib:10.2f}")
    print(f"RESULT impl=pytorch B={B} T={T} tokens_per_s={tokens_per_s:.1f} "
          f"ms_per_step={ms_per_step:.3f} mfu={mfu:.4f} mem_gib={mem_gib:.3f} loss={loss.item():.4f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="gpt2-124m", choices=sorted(PRESETS))
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--peak-tflops", type=float, default=989.0)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device visible to PyTorch", file=sys.stderr)
        return 3
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    B = args.batch
    while B >= 1:
        try:
            run(args, B)
            return 0
        except torch.OutOfMemoryError:
            torch._dynamo.reset()
            torch.cuda.empty_cache()
            print(f"B={B} does not fit in GPU memory with PyTorch; trying B={B // 2}", file=sys.stderr)
            B //= 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
