"""RelFlexformer: the NUFFT path and the random-feature fold vs the exact direct sum.

Inference (no grad), fp32, B=1, H=4, head_dim 16 (elu+1 features, m = Dv = 16), tokens at
uniform random positions in the unit cube, Gaussian modulation with per-head scales
(0.1, 0.15, 0.2, 0.3); L in --lengths (default 1K .. 16K).

Cases, timed round robin at each L (``relpos.nn.mixers.relflexformer.relflexformer_attention``):

* ``direct`` — the exact O(L^2) sum (``(B, H, L, L)`` weights materialised): the baseline
  (ratio 1.0); run up to ``--max-direct``.
* ``nufft-1e-3`` / ``nufft-1e-5`` — the quadrature grid planned for that tolerance
  (``plan_grid``) through the fused type-1 / type-2 NUFFT: O(C (L w^3 + n_f^3 log n_f)) for
  ``C = H m (Dv + 1)`` columns.
* ``random-128`` — 128 random Fourier frequencies per head (a rank-256 fold, 4096 features):
  O(L (2K m) Dv), stochastic.

Printed: the table (median ms, ratio vs direct at the same L, max |out - direct| where the
direct sum ran, the grid), the log-log slope of time vs L per case, the crossover with the
direct sum, and the extra peak memory of one call in a fresh child at ``--memory-at``.

Usage: .venv/bin/python benchmarks/bench_relflexformer.py [--quick] [--lengths ...]
       [--max-direct 8192] [--memory-at 8192]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _common import (
    add_common_args,
    child_args,
    finish_args,
    fmt,
    header,
    log,
    machine_info,
    markdown_table,
    measure_memory,
    memory_child,
    time_round_robin,
    write_json,
)
from bench_linear import crossing, slope

from relpos.nn.mixers.relflexformer import GaussianModulation, plan_grid, relflexformer_attention

NAME = "relflexformer"
B, H, D = 1, 4, 16
SCALES = [0.1, 0.15, 0.2, 0.3]
LENGTHS = [1024, 2048, 4096, 8192, 16384]
QUICK_LENGTHS = [512, 1024]
BASELINE = "direct"
CASES = [BASELINE, "nufft-1e-3", "nufft-1e-5", "random-128"]


def make_inputs(L: int):
    g = torch.Generator().manual_seed(0)
    phi_q = torch.nn.functional.elu(torch.randn(B, H, L, D, generator=g)) + 1
    phi_k = torch.nn.functional.elu(torch.randn(B, H, L, D, generator=g)) + 1
    v = torch.randn(B, H, L, D, generator=g)
    pos = torch.rand(B, L, 3, generator=g)
    return phi_q, phi_k, v, pos


MODULATION = GaussianModulation(H, 3, SCALES, learnable=False)


def build_case(case: str, phi_q, phi_k, v, pos) -> tuple[Callable[[], torch.Tensor], dict]:
    mod = MODULATION
    if case == BASELINE:
        return lambda: relflexformer_attention(phi_q, phi_k, v, pos, pos, mod, method="direct"), {}
    if case.startswith("nufft"):
        tol = float(case.split("-", 1)[1])
        span = pos[0].amax(0) - pos[0].amin(0)
        grid = plan_grid(mod, span, tol)
        note = {"grid": f"(2*{grid.half_modes}+1)^3, h={grid.h:.3f}"}
        return (
            lambda: relflexformer_attention(
                phi_q, phi_k, v, pos, pos, mod, method="nufft", tol=tol
            ),
            note,
        )
    K = int(case.split("-")[1])
    base = mod.draw(K, torch.Generator().manual_seed(0))
    return (
        lambda: relflexformer_attention(
            phi_q, phi_k, v, pos, pos, mod, method="random", random_base=base
        ),
        {"grid": f"rank {2 * K} fold"},
    )


def run_length(L: int, cases: list[str], args) -> dict:
    inputs = make_inputs(L)
    fns, notes, first, outs = {}, {}, {}, {}
    for case in cases:
        fn, note = build_case(case, *inputs)
        t0 = time.perf_counter()
        outs[case] = fn()  # the first call, kept for the error column
        t = time.perf_counter() - t0
        first[case] = t
        fns[case], notes[case] = fn, note
        log(f"  L={L} {case}: first call {t:.2f} s {note}")
    timing = time_round_robin(fns, warmup=0, repeats=args.repeats)
    res = {}
    for c in cases:
        err = None
        if BASELINE in outs and c != BASELINE:
            err = float((outs[c] - outs[BASELINE]).abs().max())
        res[c] = {**timing[c], "first_call_s": first[c], "max_abs_err": err, **notes[c]}
    return res


def report(args, info: dict, results: dict, mem: dict) -> str:
    settings = {
        "B": B,
        "H": H,
        "head_dim": D,
        "features": "elu1 (m = 16)",
        "positions": "uniform in [0, 1)^3",
        "modulation": f"gaussian, scales {SCALES}",
        "dtype": "float32",
        "grad": "off",
        "lengths": args.lengths,
        "repeats": args.repeats,
    }
    out = [
        header("relpos RelFlexformer: NUFFT and random features vs the direct sum", info, settings)
    ]
    out.append(
        "\nms = median of the repeats (cases timed in turn); ratio = ms / ms of the direct sum "
        "at the same L (blank where it was not run); err = max |out - direct|."
    )
    rows = []
    for L in args.lengths:
        base = results[L].get(BASELINE, {}).get("median_s")
        for case, r in results[L].items():
            rows.append(
                [
                    case,
                    L,
                    fmt(r["median_s"] * 1e3, 1),
                    fmt(r["median_s"] / base, 2) if base else "",
                    f"{r['max_abs_err']:.1e}" if r.get("max_abs_err") is not None else "",
                    r.get("grid", "exact"),
                ]
            )
    out.append("")
    out.append(markdown_table(["case", "L", "ms", "ratio", "err", "grid"], rows))
    out.append("\n### Growth and crossover\n")
    fits = {}
    for case in CASES:
        pts = [(L, results[L][case]["median_s"]) for L in args.lengths if case in results[L]]
        fits[case] = (slope(pts), pts)
    base_fit = fits[BASELINE][0]
    trows = []
    for case in CASES:
        fit, pts = fits[case]
        measured = next(
            (L for L, t in pts if BASELINE in results[L] and t < results[L][BASELINE]["median_s"]),
            None,
        )
        cross = None
        if case != BASELINE and fit and base_fit and base_fit[1] != fit[1]:
            cross = math.exp((fit[0] - base_fit[0]) / (base_fit[1] - fit[1]))
        trows.append(
            [
                case,
                f"{pts[0][0]}..{pts[-1][0]}" if pts else "-",
                fmt(fit[1], 2) if fit else "n/a",
                "-" if case == BASELINE else (measured or "none measured"),
                "-" if case == BASELINE else crossing(cross, pts),
            ]
        )
    out.append(
        markdown_table(
            ["case", "L range", "log-log slope", "faster than direct from L", "crossover (fit)"],
            trows,
        )
    )
    if mem:
        mrows = [
            [c, L, fmt(m.get("extra_mb"), 1) if "extra_mb" in m else m.get("error")]
            for (c, L), m in mem.items()
        ]
        out.append("\n### Extra peak memory of one call (fresh child)\n")
        out.append(markdown_table(["case", "L", "extra peak MB"], mrows))
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, NAME)
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument("--max-direct", type=int, default=8192, help="largest L, direct sum")
    parser.add_argument("--memory-at", type=int, default=8192, help="L measured for memory")
    args = parser.parse_args()
    if args.lengths is None:
        args.lengths = QUICK_LENGTHS if args.quick else LENGTHS
    args.lengths = sorted(args.lengths)
    finish_args(args, NAME, repeats=2, warmup=0)
    torch.set_grad_enabled(False)
    if args.measure_memory:
        (L,) = args.lengths
        fn, _ = build_case(args.case, *make_inputs(L))
        memory_child(fn)
        return
    info = machine_info()
    mem: dict = {}
    results = {}
    for L in args.lengths:
        cases = [c for c in CASES if c != BASELINE or L <= args.max_direct]
        if not args.no_memory and L == args.memory_at:
            for case in cases:
                m = measure_memory(__file__, case, [*child_args(), "--lengths", str(L)])
                mem[(case, L)] = m
                log(f"memory L={L} {case}: {m}")
        log(f"timing L={L}")
        results[L] = run_length(L, cases, args)
    info["loadavg_end"] = list(os.getloadavg())
    text = report(args, info, results, mem)
    print(text)
    write_json(
        args.json,
        {
            "benchmark": NAME,
            "machine": info,
            "settings": {"B": B, "H": H, "D": D, "scales": SCALES, "lengths": args.lengths},
            "repeats": args.repeats,
            "results": {str(L): results[L] for L in args.lengths},
            "memory": {f"{c}@{L}": m for (c, L), m in mem.items()},
            "markdown": text,
        },
    )


if __name__ == "__main__":
    main()
