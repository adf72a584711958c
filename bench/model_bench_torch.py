#!/usr/bin/env python3
"""PyTorch reference for bench/model_bench.cc: the same GPT-2 configs, batch shapes, random
tokens, global-norm clipping and AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.1 on 2-D
weights only, tied lm_head), timed the same way (tokens/s over full optimizer steps, best of
--rounds rounds of --steps steps after --warmup steps).

  /usr/bin/python3 bench/model_bench_torch.py [--preset tiny --preset small-4x256]
      [--batch B] [--seq T] [--steps N] [--warmup W] [--rounds R] [--threads N]

Prints a table and one line per preset for bench/model_bench.sh:
  RESULT <preset> <B> <T> <threads> <ms/step> <tokens/s> <params>
Needs torch (Debian: apt-get install -y python3-torch, torch 1.13 on /usr/bin/python3).
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# Same presets as worker/model/config.cc: vocab, context, layers, heads, channels.
PRESETS = {
    "tiny": (256, 128, 4, 4, 128),
    "small-4x256": (256, 256, 4, 4, 256),
    "gpt2-124m": (50257, 1024, 12, 12, 768),
    "gpt2-350m": (50257, 1024, 24, 16, 1024),
}


class Block(nn.Module):
    def __init__(self, C, NH, T):
        super().__init__()
        self.NH = NH
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)
        self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)))

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        hs = C // self.NH
        q = q.view(B, T, self.NH, hs).transpose(1, 2)
        k = k.view(B, T, self.NH, hs).transpose(1, 2)
        v = v.view(B, T, self.NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, maxT, L, NH, C):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(maxT, C)
        self.h = nn.ModuleList([Block(C, NH, maxT) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if ("c_proj" in name or "mlp_proj" in name) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif "ln" in name and name.endswith("weight"):
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied classifier
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", action="append")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1337)
    print(f"{'preset':<12} {'B':>4} {'T':>5} {'threads':>8} {'params':>10} {'ms/step':>12} {'tokens/s':>12}")
    results = []
    for preset in args.preset or ["tiny", "small-4x256"]:
        V, maxT, L, NH, C = PRESETS[preset]
        B, T = args.batch, args.seq or min(maxT, 256)
        model = GPT(V, maxT, L, NH, C)
        nparams = sum(p.numel() for p in model.parameters())
        decay = [p for p in model.parameters() if p.dim() == 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=3e-4, betas=(0.9, 0.95), eps=1e-8)

        def step():
            x = torch.randint(0, V, (B, T))
            y = torch.randint(0, V, (B, T))
            opt.zero_grad(set_to_none=True)
            loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

        for _ in range(args.warmup):
            step()
        seconds = float("inf")
        for _ in range(max(1, args.rounds)):
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            seconds = min(seconds, time.perf_counter() - start)
        ms = 1000.0 * seconds / args.steps
        tps = B * T * args.steps / seconds
        print(f"{preset:<12} {B:>4} {T:>5} {args.threads:>8} {nparams:>10} {ms:>12.1f} {tps:>12.0f}")
        results.append(f"RESULT {preset} {B} {T} {args.threads} {ms:.3f} {tps:.1f} {nparams}")
    for r in results:
        print(r)


if __name__ == "__main__":
    main()
