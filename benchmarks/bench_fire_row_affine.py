"""A/B in one process: FIRE's forward above its threshold (B=1, H=8, D=64, fp32, one thread,
process CPU time, interleaved rounds), ratio to no-bias SDPA with the same mask.

``row-affine``: the library (``backend="chunked"``, the row-affine path: two tables per group
of rows on Hankel views, per-pair bias at the distances whose rows cross a knot); ``tile``:
the per-pair tile path it replaced for inference, forced by switching the row-affine path
off; ``auto``: what ``backend="auto"`` runs. docs/benchmarks.md ("FIRE above its threshold").

Usage: python benchmarks/bench_fire_row_affine.py [L ...] [--repeats N]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os

import torch
import torch.nn.functional as F

import relpos
from relpos_lab import measure

chunked = importlib.import_module("relpos.attention.chunked")
api = importlib.import_module("relpos.attention.api")


def without_row_affine(fn):
    def run():
        original = chunked._runs_row_affine
        chunked._runs_row_affine = lambda call: False
        try:
            return fn()
        finally:
            chunked._runs_row_affine = original

    return run


def measure_case(enc, q, k, v, causal: bool, repeats: int) -> dict:
    """One length and mask: the paths, the agreement and the ratios to no-bias SDPA."""

    def run(backend: str, row_affine: bool = True):
        def call():
            with torch.no_grad():
                return relpos.attention(q, k, v, enc, causal=causal, backend=backend)

        return call if row_affine else without_row_affine(call)

    def nobias():
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    with torch.no_grad():
        paths = {
            "row-affine": api.plan(q, k, v, enc, causal=causal, backend="chunked"),
            "auto": api.plan(q, k, v, enc, causal=causal),
        }
    agreement = float((run("chunked")() - run("chunked", row_affine=False)()).abs().max())
    fns = {
        "sdpa-nobias": nobias,
        "row-affine": run("chunked"),
        "tile": run("chunked", row_affine=False),
        "auto": run("auto"),
    }
    t = measure.time_round_robin(fns, warmup=1, repeats=repeats, clock="cpu")
    base = t["sdpa-nobias"]["median_s"]
    return {
        "L": q.shape[2],
        "mask": "causal" if causal else "full",
        "ms_sdpa_nobias": round(base * 1e3, 1),
        **{n: round(x["median_s"] / base, 3) for n, x in t.items() if n != "sdpa-nobias"},
        "paths": {n: list(p) for n, p in paths.items()},
        "max_abs_row_affine_vs_tile": agreement,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lengths", nargs="*", type=int, default=[1024, 2048, 4096])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--masks", default="causal,full")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("machine:", measure.machine_line(measure.machine_info()))
    print("load at start:", os.getloadavg())
    B, H, D = 1, 8, 64
    torch.manual_seed(0)
    enc = relpos.create("fire", num_heads=H, head_dim=D)
    rows = []
    for L in args.lengths:
        q, k, v = (torch.randn(B, H, L, D) for _ in range(3))
        for mask in args.masks.split(","):
            row = measure_case(enc, q, k, v, mask == "causal", args.repeats)
            rows.append(row)
            print(json.dumps(row))
    print("load at end:", os.getloadavg())
    print("| L | mask | row-affine | tile (before) | auto (runs) |")
    print("|---:|---|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['L']} | {r['mask']} | {r['row-affine']:.2f} | {r['tile']:.2f} | "
            f"{r['auto']:.2f} ({'/'.join(r['paths']['auto'])}) |"
        )


if __name__ == "__main__":
    main()
