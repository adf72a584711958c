#!/usr/bin/env python3
"""Checks longhaul's CPU GPT-2 against an independent PyTorch implementation on the same
weights: loss and every parameter's gradient for one micro-batch.

  mkdir -p /tmp/gpt2check
  build/<dir>/bench/model_bench --preset tiny --batch 4 --seq 64 --dump /tmp/gpt2check
  /usr/bin/python3 bench/model_check_torch.py /tmp/gpt2check

The longhaul flat buffer is in Hugging Face GPT-2 order and layout (Conv1D weights (in, out),
so nn.Linear gets the transpose). Prints the loss of both and, per tensor, the largest gradient
difference relative to that tensor's largest gradient; exits 1 above 1e-3.
"""
import sys

import numpy as np
import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from model_bench_torch import GPT  # noqa: E402


def main(d):
    V, maxT, L, NH, C, B, T = map(int, open(f"{d}/config.txt").read().split())
    x = torch.from_numpy(np.fromfile(f"{d}/inputs.i32", dtype=np.int32).astype(np.int64)).view(B, T)
    y = torch.from_numpy(np.fromfile(f"{d}/targets.i32", dtype=np.int32).astype(np.int64)).view(B, T)
    flat = np.fromfile(f"{d}/params.f32", dtype=np.float32)
    gflat = np.fromfile(f"{d}/grads.f32", dtype=np.float32)
    ours_loss = float(open(f"{d}/loss.txt").read())

    torch.set_default_dtype(torch.float64)  # the reference runs in double
    model = GPT(V, maxT, L, NH, C)
    # (name, torch tensor, shape in the longhaul buffer, transpose?) in HF order.
    layout = [("wte.weight", model.wte.weight, (V, C), False),
              ("wpe.weight", model.wpe.weight, (maxT, C), False)]
    for i, blk in enumerate(model.h):
        p = f"h.{i}."
        layout += [(p + "ln_1.weight", blk.ln_1.weight, (C,), False),
                   (p + "ln_1.bias", blk.ln_1.bias, (C,), False),
                   (p + "attn.c_attn.weight", blk.c_attn.weight, (C, 3 * C), True),
                   (p + "attn.c_attn.bias", blk.c_attn.bias, (3 * C,), False),
                   (p + "attn.c_proj.weight", blk.c_proj.weight, (C, C), True),
                   (p + "attn.c_proj.bias", blk.c_proj.bias, (C,), False),
                   (p + "ln_2.weight", blk.ln_2.weight, (C,), False),
                   (p + "ln_2.bias", blk.ln_2.bias, (C,), False),
                   (p + "mlp.c_fc.weight", blk.c_fc.weight, (C, 4 * C), True),
                   (p + "mlp.c_fc.bias", blk.c_fc.bias, (4 * C,), False),
                   (p + "mlp.c_proj.weight", blk.mlp_proj.weight, (4 * C, C), True),
                   (p + "mlp.c_proj.bias", blk.mlp_proj.bias, (C,), False)]
    layout += [("ln_f.weight", model.ln_f.weight, (C,), False),
               ("ln_f.bias", model.ln_f.bias, (C,), False)]
    offset, ours_grads = 0, {}
    with torch.no_grad():
        for name, tensor, shape, transpose in layout:
            n = int(np.prod(shape))
            w = torch.from_numpy(flat[offset:offset + n].astype(np.float64)).view(shape)
            tensor.copy_(w.t() if transpose else w)
            g = torch.from_numpy(gflat[offset:offset + n].astype(np.float64)).view(shape)
            ours_grads[name] = g.t() if transpose else g
            offset += n
    assert offset == flat.size, f"flat buffer has {flat.size} floats, layout covers {offset}"
    for m in model.modules():  # LayerNorm eps is 1e-5 on both sides
        if isinstance(m, torch.nn.LayerNorm):
            assert m.eps == 1e-5
    model.zero_grad()
    loss = model(x, y)
    loss.backward()
    # The GELU in model_bench_torch is torch's tanh approximation, as GPT-2's.
    print(f"loss: longhaul {ours_loss:.7f}  torch(float64) {loss.item():.7f}  "
          f"diff {abs(ours_loss - loss.item()):.2e}")
    worst = abs(ours_loss - loss.item()) / abs(loss.item())
    for name, tensor, _, _ in layout:
        ref = tensor.grad
        scale = ref.abs().max().item() or 1.0
        rel = (ours_grads[name] - ref).abs().max().item() / scale
        worst = max(worst, rel)
        print(f"  {name:<24} max|grad| {scale:.3e}  max rel diff {rel:.2e}")
    print(f"worst relative difference {worst:.2e}")
    return 0 if worst < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/gpt2check"))
