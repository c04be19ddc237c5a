"""Row-dependent terms (CoPE, TRA): the chunked backend's row-suffix path against eager.

fp32, B=1, H=8, D=64, causal, L in --lengths (1024 2048; --quick: 256 512). One training
step = drop the old gradients, forward, ``loss = (out * g).sum()`` with a fixed random ``g``,
backward into q, k, v and the encoding's parameters. Cases per encoding (``cope`` with
``npos_max=64``, ``tra`` hard gates):

* ``eager``: the reference, ``(B, H, L, L)`` logits, gates and counts materialised;
* ``chunked``: the row-suffix path (query blocks, key blocks right to left carrying the
  suffix sum of the gates, online softmax, activation checkpointing);
* ``sdpa-plain``: plain causal attention without an encoding (fused SDPA), the floor.

Reports seconds per step (median of --repeats, round robin) and the ratios to ``eager`` and
to ``sdpa-plain``. Before timing, chunked is compared with eager once (forward and q grad).

Usage: .venv/bin/python benchmarks/bench_row_dependent.py [--quick] [--lengths 1024 2048]
"""

from __future__ import annotations

import argparse
import os
import sys
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

NAME = "row_dependent"
B, H, D = 1, 8, 64
LENGTHS = [1024, 2048]
QUICK_LENGTHS = [256, 512]
ENCODINGS = {"cope": {"npos_max": 64}, "tra": {}}


def step(enc, backend, q, k, v, g, inputs=None):
    def run():
        for t in (q, k, v, *(enc.parameters() if enc is not None else ())):
            t.grad = None
        out = relpos.attention(q, k, v, enc, causal=True, backend=backend, inputs=inputs)
        (out * g).sum().backward()

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
    rows = []
    for L in lengths:
        gen = torch.Generator().manual_seed(1)
        q, k, v = (torch.randn(B, H, L, D, generator=gen).requires_grad_() for _ in range(3))
        g = torch.randn(B, H, L, D, generator=gen)
        for name, options in ENCODINGS.items():
            torch.manual_seed(0)
            enc = relpos.create(name, num_heads=H, head_dim=D, **options)
            with torch.no_grad():  # CoPE's zero-initialised table would give plain attention
                for p in enc.parameters():
                    if bool((p == 0).all()):
                        p.normal_(0.0, 0.1)
            # TRA's forget gate reads the layer input (inputs["layer_input"])
            inputs = enc.example_inputs(B, L, L, gen) or None
            ref = relpos.attention(q, k, v, enc, causal=True, backend="eager", inputs=inputs)
            out = relpos.attention(q, k, v, enc, causal=True, backend="chunked", inputs=inputs)
            err = float((out - ref).detach().abs().max())
            log(f"L={L} {name}: max |chunked - eager| = {err:.2e}")
            fns = {
                "eager": step(enc, "eager", q, k, v, g, inputs),
                "chunked": step(enc, "chunked", q, k, v, g, inputs),
                "sdpa-plain": step(None, "sdpa", q, k, v, g),
            }
            timed = time_round_robin(fns, warmup=args.warmup, repeats=args.repeats)
            results[f"{name}-{L}"] = {"max_abs_error": err, "timings": timed}
            t = {n: timed[n]["median_s"] for n in fns}
            rows.append(
                [
                    name,
                    L,
                    fmt(t["eager"], 3),
                    fmt(t["chunked"], 3),
                    fmt(t["sdpa-plain"], 3),
                    fmt(t["chunked"] / t["eager"]),
                    fmt(t["chunked"] / t["sdpa-plain"]),
                ]
            )
    info["loadavg_end"] = list(os.getloadavg())
    settings = {"B": B, "H": H, "D": D, "repeats": args.repeats, "warmup": args.warmup}
    print(header("Row-dependent terms: training step (s)", info, settings))
    print()
    heads = ["encoding", "L", "eager", "chunked", "sdpa-plain", "chunked/eager", "chunked/plain"]
    print(markdown_table(heads, rows))
    write_json(args.json, {"info": info, "settings": settings, "results": results})


if __name__ == "__main__":
    main()
