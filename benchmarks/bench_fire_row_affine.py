"""A/B in one process: FIRE's forward above its threshold (B=1, H=8, D=64, fp32, one thread,
process CPU time, interleaved rounds), ratio to no-bias SDPA with the same mask.

``row-affine``: the library (``backend="chunked"``, the row-affine path: two tables per group
of rows on Hankel views, per-pair bias at the distances whose rows cross a knot); ``tile``:
the per-pair tile path it replaced for inference, forced by switching the row-affine path
off; ``auto``: what ``backend="auto"`` runs; with ``--against REF``, ``REF``: the row-affine
path as it was at git commit ``REF`` (its ``chunked.py`` and FIRE's ``row_affine_tables``,
loaded from the repository's history), in the same rounds. docs/benchmarks.md ("FIRE above
its threshold").

Usage: python benchmarks/bench_fire_row_affine.py [L ...] [--repeats N] [--against REF]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import types
from pathlib import Path

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


def module_at(ref: str, path: str, package: str) -> types.ModuleType:
    """The module at ``path`` as it was at git commit ``ref``, loaded inside ``package`` (its
    relative imports resolve to today's modules), its registrations removed."""
    root = Path(__file__).resolve().parents[1]
    source = subprocess.run(
        ["git", "show", f"{ref}:{path}"], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    module = types.ModuleType(f"{package}._at_{ref}")
    module.__package__ = package
    source = "\n".join(l for l in source.splitlines() if not l.startswith("@register("))
    exec(compile(source, f"{ref}:{path}", "exec"), module.__dict__)
    return module


def at_commit(ref: str, fn):
    """``fn`` with the row-affine path of commit ``ref`` (the engine's function and FIRE's
    tables) swapped in for the call."""
    from relpos.encodings.bias.fire import FIRE

    old_chunked = module_at(ref, "src/relpos/attention/chunked.py", "relpos.attention")
    old_fire = module_at(ref, "src/relpos/encodings/bias/fire.py", "relpos.encodings.bias")

    def run():
        engine, tables = chunked._row_affine_attention, FIRE.row_affine_tables
        chunked._row_affine_attention = old_chunked._row_affine_attention
        FIRE.row_affine_tables = old_fire.FIRE.row_affine_tables
        try:
            return fn()
        finally:
            chunked._row_affine_attention, FIRE.row_affine_tables = engine, tables

    return run


def measure_case(enc, q, k, v, causal: bool, repeats: int, against: str | None = None) -> dict:
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
    if against:
        fns[against] = at_commit(against, run("chunked"))
        with torch.no_grad():
            gap = float((fns[against]() - run("chunked")()).abs().max())
    t = measure.time_round_robin(fns, warmup=1, repeats=repeats, clock="cpu")
    base = t["sdpa-nobias"]["median_s"]
    return {
        "L": q.shape[2],
        "mask": "causal" if causal else "full",
        "ms_sdpa_nobias": round(base * 1e3, 1),
        **{n: round(x["median_s"] / base, 3) for n, x in t.items() if n != "sdpa-nobias"},
        "paths": {n: list(p) for n, p in paths.items()},
        "max_abs_row_affine_vs_tile": agreement,
        **({f"max_abs_row_affine_vs_{against}": gap} if against else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lengths", nargs="*", type=int, default=[1024, 2048, 4096])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--masks", default="causal,full")
    parser.add_argument(
        "--against", metavar="REF", help="also time the row-affine path of git commit REF"
    )
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
            row = measure_case(enc, q, k, v, mask == "causal", args.repeats, args.against)
            rows.append(row)
            print(json.dumps(row))
    print("load at end:", os.getloadavg())
    ref = f" {args.against} |" if args.against else ""
    print(f"| L | mask | row-affine |{ref} tile | auto (runs) |")
    print("|---:|---|---:|" + ("---:|" if args.against else "") + "---:|---|")
    for r in rows:
        old = f" {r[args.against]:.2f} |" if args.against else ""
        print(
            f"| {r['L']} | {r['mask']} | {r['row-affine']:.2f} |{old} {r['tile']:.2f} | "
            f"{r['auto']:.2f} ({'/'.join(r['paths']['auto'])}) |"
        )


if __name__ == "__main__":
    main()
