"""What ``backend="auto"`` costs on top of the backend it chooses, at small L.

At L = 64-256 a Python-side plan, a bias-table build or a mask build can cost as much as the
attention itself. Per case (encoding, L, causal forward under ``torch.no_grad()`` or a
training step), three calls of the same inputs are timed in one interleaved round robin
(``_common.time_round_robin``, process CPU time, one thread by default):

* ``auto``: ``relpos.attention(q, k, v, enc, causal=True)``;
* ``chosen``: the same call with ``backend=`` the backend ``relpos.attention.plan`` names for
  it (so the only difference is auto's choice: facts, candidates, the policy table);
* ``floor``: ``F.scaled_dot_product_attention`` with the encoding's dense bias (or without one
  for RoPE, after relpos's rotation) computed once outside the timed call: the cost of the
  attention kernel alone, which no relpos path can undercut for this call.

Each sample is ``--calls`` calls (small L runs in tens of microseconds). The report gives
``auto / chosen`` (auto's own overhead) and ``chosen / floor`` (what the encoding's per-call
work costs on top of the kernel), both as ratios of medians in the same run.

Usage: .venv/bin/python benchmarks/bench_auto_overhead.py [--quick] [--threads 1]
    [--json runs/bench/auto_overhead.json]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.nn.functional as F
from _common import (
    add_common_args,
    finish_args,
    header,
    log,
    machine_info,
    markdown_table,
    time_round_robin,
    write_json,
)

import relpos
from relpos.attention import plan

ENCODINGS = ("alibi", "t5", "fire", "kerple-log", "rope")
LENGTHS = (64, 128, 256)
B, H, D = 1, 8, 64


def inputs(length: int, train: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(B, H, length, D, generator=g) for _ in range(3))
    return tuple(t.requires_grad_(train) for t in (q, k, v))  # type: ignore[return-value]


def floor_call(enc: relpos.Encoding, q, k, v) -> Callable[[], torch.Tensor]:
    """SDPA with the encoding's score term precomputed (RoPE: rotated q and k)."""
    length = q.shape[-2]
    pos = torch.arange(length)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    with torch.no_grad():
        if enc.has_bias:
            ctx = enc.prepare(q, k, pos[None], pos[None])
            b = torch.arange(q.shape[0])[:, None, None, None]
            h = torch.arange(q.shape[1])[None, :, None, None]
            bias = enc.bias(ctx, b, h, pos[:, None], pos[None, :]).to(q.dtype)
            bias = bias.masked_fill(~causal, float("-inf"))
            rq, rk = q, k
        else:
            bias = None
            rq, rk = enc.rotate_qk(q, k, pos[None], pos[None]) if enc.has_rotary else (q, k)
    rq, rk = (
        rq.detach().requires_grad_(q.requires_grad),
        rk.detach().requires_grad_(k.requires_grad),
    )
    if bias is None:
        return lambda: F.scaled_dot_product_attention(rq, rk, v, is_causal=True)
    return lambda: F.scaled_dot_product_attention(rq, rk, v, attn_mask=bias)


def step(fn: Callable[[], torch.Tensor], train: bool, calls: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(calls):
            if train:
                fn().sum().backward()
            else:
                with torch.no_grad():
                    fn()

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, "auto_overhead")
    parser.add_argument("--calls", type=int, default=None, help="calls per timed sample")
    args = parser.parse_args(argv)
    finish_args(args, "auto_overhead", repeats=9, warmup=2)
    if args.threads is None:
        torch.set_num_threads(1)
    calls = args.calls or (5 if args.quick else 20)
    lengths = (64, 256) if args.quick else LENGTHS
    rows, records = [], []
    for train in (False, True):
        for name in ENCODINGS:
            for length in lengths:
                torch.manual_seed(0)
                enc = relpos.create(name, num_heads=H, head_dim=D)
                q, k, v = inputs(length, train)
                with torch.set_grad_enabled(train):
                    backend, path = plan(q, k, v, enc, causal=True)
                args_ = (q, k, v, enc)

                def auto(a=args_):
                    return relpos.attention(*a, causal=True)

                def chosen(a=args_, b=backend):
                    return relpos.attention(*a, causal=True, backend=b)

                fns = {
                    "auto": step(auto, train, calls),
                    "chosen": step(chosen, train, calls),
                    "floor": step(floor_call(enc, q, k, v), train, calls),
                }
                t = time_round_robin(fns, warmup=args.warmup, repeats=args.repeats, clock="cpu")
                med = {n: t[n]["median_s"] / calls for n in t}
                mode = "train" if train else "forward"
                log(f"{name} L={length} {mode}: {backend}/{path} {med}")
                rows.append(
                    [
                        name,
                        length,
                        mode,
                        f"{backend}/{path}",
                        f"{1e6 * med['floor']:.0f}",
                        f"{med['auto'] / med['chosen']:.2f}",
                        f"{med['chosen'] / med['floor']:.2f}",
                    ]
                )
                records.append(
                    {"encoding": name, "length": length, "mode": mode, "plan": [backend, path]}
                    | {"timings": t, "calls_per_sample": calls}
                )
    settings = {"B": B, "H": H, "D": D, "causal": True, "repeats": args.repeats, "calls": calls}
    info = machine_info()
    heads = ["encoding", "L", "mode", "auto ran", "floor us/call", "auto / chosen"]
    text = header("auto's per-call overhead", info, settings) + "\n\n"
    text += markdown_table([*heads, "chosen / floor"], rows)
    print(text)
    write_json(args.json, {"machine": info, "settings": settings, "cases": records})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
