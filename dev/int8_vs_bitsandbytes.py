#!/usr/bin/env python3
"""test/int8_ref.py (what load_in_8bit stores and multiplies with, llmc/int8.h) against the real
bitsandbytes on a CPU. Needs a Python with PyTorch >= 2.2 and bitsandbytes (not the test suite's
Debian PyTorch 1.13), for example:

    python3 -m venv /tmp/bnbenv && /tmp/bnbenv/bin/pip install torch bitsandbytes numpy
    /tmp/bnbenv/bin/python dev/int8_vs_bitsandbytes.py

Checks, on random weights of many shapes and scales (float32 and bfloat16 sources, all-zero
rows, outliers, float16 subnormals):
  1. Int8Params(..., has_fp16_weights=False).to("cpu") (what transformers' load_in_8bit does):
     codes (CB) and row scales (SCB) equal int8_ref.quantize's, element for element;
  2. the weight MatMul8bitFp multiplies with when training on a CPU, CB * (SCB * (1/127)),
     equals int8_ref.roundtrip bit for bit;
  3. Linear8bitLt in training mode on a CPU (float32 input): its output equals
     F.linear(x, int8_ref.roundtrip(W)) exactly.
Prints one line per check and exits 1 on a mismatch."""
import os
import sys

import numpy as np
import torch
import bitsandbytes as bnb

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test"))
import int8_ref as I  # noqa: E402


def weights(rng, n=40):
    for t in range(n):
        r, c = int(rng.integers(1, 300)), int(rng.integers(1, 700))
        w = (rng.standard_normal((r, c)) * 10 ** rng.uniform(-6, 2)).astype(np.float32)
        if t % 5 == 0:
            w[rng.integers(0, r)] = 0
        if t % 7 == 0:
            w[rng.integers(0, r), rng.integers(0, c)] *= 300
        yield w


def main():
    print("torch %s, bitsandbytes %s" % (torch.__version__, bnb.__version__))
    rng = np.random.default_rng(0)
    ok = True
    n = bad_q = bad_w = 0
    for w in weights(rng):
        for dt in (torch.float32, torch.bfloat16):
            wt = torch.from_numpy(w).to(dt)
            p = bnb.nn.Int8Params(wt.clone(), requires_grad=False, has_fp16_weights=False).to("cpu")
            q, s = I.quantize(wt.float().numpy())
            n += q.size
            bad_q += int(np.sum(p.data.numpy() != q)) + int(np.sum(p.SCB.numpy() != s))
            wb = p.data.to(torch.float32).mul_(p.SCB.unsqueeze(1).mul(1.0 / 127.0)).numpy()
            bad_w += int(np.sum(wb.view(np.uint32) != I.dequantize(q, s).view(np.uint32)))
    print("1. Int8Params codes and scales vs int8_ref.quantize: %d mismatches in %d elements" % (bad_q, n))
    print("2. MatMul8bitFp's weight vs int8_ref.roundtrip: %d of %d elements differ" % (bad_w, n))
    ok &= bad_q == 0 and bad_w == 0
    worst = 0.0
    for (n_in, n_out) in ((256, 128), (1024, 512)):
        w = (rng.standard_normal((n_out, n_in)) * 0.02).astype(np.float32)
        lin = bnb.nn.Linear8bitLt(n_in, n_out, bias=False, has_fp16_weights=False, threshold=6.0)
        lin.weight = bnb.nn.Int8Params(torch.from_numpy(w), requires_grad=False, has_fp16_weights=False)
        lin = lin.to("cpu").train()
        x = torch.randn(32, n_in, requires_grad=True)
        y = lin(x).detach()
        yr = torch.nn.functional.linear(x.detach(), torch.from_numpy(I.roundtrip(w)))
        worst = max(worst, float((y - yr).abs().max()))
    print("3. Linear8bitLt (training, CPU, float32) vs F.linear with int8_ref's weight: max |diff| %.3g" % worst)
    ok &= worst == 0.0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
