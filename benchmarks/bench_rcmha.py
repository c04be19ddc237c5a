"""RCMHA (Sugiharto et al. 2023): the relative scoring's training step, relpos vs the official
computation order, and the cost of the q/k/v convolutions in a layer.

fp32, B=1, H=8, D=64, causal, L in --lengths (1024 2048; --quick: 256 512). One step = drop
the old gradients, forward, ``loss = (out * g).sum()`` with a fixed random ``g``, backward.

Scoring cases (q, k, v given; ``rcmha`` with P = 4096, random tables):

* ``official``: the official ``get_scores`` order (hermansh-id/rcmha, restated): the
  ``(L, 2L)`` products ``q . E[P - L : P + L]`` and the bias ``e``, the Transformer-XL skew
  (pad a zero column, reshape), the content term ``(q + u) . k``, a causal mask, softmax;
* ``relpos``: ``relpos.attention(q, k, v, enc, causal=True)`` (``auto``: the table reader
  reads ``q @ E^T`` over the reachable rows per query block, no ``(L, 2L)`` skew buffer);
* ``sdpa-plain``: causal attention without an encoding (fused SDPA), the floor.

Layer cases (``relpos.nn.MultiHeadAttention(512, 8, "rcmha")`` on ``x (1, L, 512)``):
``layer`` without and ``layer+conv`` with ``qkv_conv=3`` (the three causal depth-wise
convolutions). Reports medians (round robin) and ratios. Before timing, relpos and the
official order are compared once.

Usage: .venv/bin/python benchmarks/bench_rcmha.py [--quick] [--lengths 1024 2048]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import (
    add_common_args,
    finish_args,
    fmt,
    header,
    log,
    machine_info,
    markdown_table,
    time_round_robin,
    write_json,
)

import relpos
from relpos.nn import MultiHeadAttention

NAME = "rcmha"
B, H, D = 1, 8, 64
LENGTHS = [1024, 2048]
QUICK_LENGTHS = [256, 512]


def skew(x: torch.Tensor) -> torch.Tensor:
    """The Transformer-XL skew on ``(B, H, Lq, W)``: ``out[..., i, c] = x[..., i, c - i]``."""
    b, h, lq, w = x.shape
    padded = torch.cat([x, x.new_zeros(b, h, lq, 1)], dim=-1).reshape(b, h, w + 1, lq)
    return padded[:, :, :-1].reshape(b, h, lq, w)


def official(enc, q, k, v):
    L, p = q.shape[2], enc.max_relative_position
    emb = enc.key_table[:, p - L : p + L]  # (H, 2L, D)
    bias = enc.distance_bias[:, p - L : p + L]  # (H, 2L)
    ac = (q + enc.content_bias[None, :, None]) @ k.transpose(-1, -2)
    bd = skew(torch.einsum("bhid,hrd->bhir", q, emb) + bias[None, :, None])[..., -L:]
    s = (ac + bd) / math.sqrt(D)
    s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def step(fn, tensors, g):
    def run():
        for t in tensors:
            t.grad = None
        (fn() * g).sum().backward()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, NAME)
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    args = parser.parse_args()
    finish_args(args, NAME, repeats=5, warmup=1)
    lengths = args.lengths or (QUICK_LENGTHS if args.quick else LENGTHS)
    info = machine_info()
    results: dict = {}
    rows, layer_rows = [], []
    for L in lengths:
        gen = torch.Generator().manual_seed(1)
        q, k, v = (torch.randn(B, H, L, D, generator=gen).requires_grad_() for _ in range(3))
        g = torch.randn(B, H, L, D, generator=gen)
        torch.manual_seed(0)
        enc = relpos.create("rcmha", num_heads=H, head_dim=D)
        with torch.no_grad():
            for p in enc.parameters():
                p.normal_(0.0, 0.1)
        params = [q, k, v, *enc.parameters()]
        with torch.no_grad():
            err = float(
                (relpos.attention(q, k, v, enc, causal=True) - official(enc, q, k, v)).abs().max()
            )
        log(f"L={L}: max |relpos - official| = {err:.2e}")
        fns = {
            "official": step(partial(official, enc, q, k, v), params, g),
            "relpos": step(partial(relpos.attention, q, k, v, enc, causal=True), params, g),
            "sdpa-plain": step(
                partial(relpos.attention, q, k, v, None, causal=True, backend="sdpa"), [q, k, v], g
            ),
        }
        timed = time_round_robin(fns, warmup=args.warmup, repeats=args.repeats)
        t = {n: timed[n]["median_s"] for n in fns}
        rows.append(
            [L, fmt(t["official"], 3), fmt(t["relpos"], 3), fmt(t["sdpa-plain"], 3),
             fmt(t["relpos"] / t["official"]), fmt(t["relpos"] / t["sdpa-plain"])]
        )  # fmt: skip
        x = torch.randn(1, L, H * D, generator=gen).requires_grad_()
        gx = torch.randn(1, L, H * D, generator=gen)
        torch.manual_seed(0)
        plain = MultiHeadAttention(H * D, H, "rcmha")
        torch.manual_seed(0)
        conv = MultiHeadAttention(H * D, H, "rcmha", qkv_conv=3)
        layers = {
            "layer": step(partial(plain, x), [x, *plain.parameters()], gx),
            "layer+conv": step(partial(conv, x), [x, *conv.parameters()], gx),
        }
        lt = time_round_robin(layers, warmup=args.warmup, repeats=args.repeats)
        m = {n: lt[n]["median_s"] for n in layers}
        layer_rows.append([L, fmt(m["layer"], 3), fmt(m["layer+conv"], 3),
                           fmt(m["layer+conv"] / m["layer"])])  # fmt: skip
        results[str(L)] = {"max_abs_error": err, "scoring": timed, "layer": lt}
    info["loadavg_end"] = list(os.getloadavg())
    settings = {"B": B, "H": H, "D": D, "repeats": args.repeats, "warmup": args.warmup}
    print(header("RCMHA: training step (s)", info, settings))
    print()
    print(markdown_table(["L", "official", "relpos", "sdpa-plain", "relpos/official",
                          "relpos/plain"], rows))  # fmt: skip
    print()
    print(markdown_table(["L", "layer", "layer+conv", "conv/no conv"], layer_rows))
    write_json(args.json, {"info": info, "settings": settings, "results": results})


if __name__ == "__main__":
    main()
