"""Kernelized (linear) attention with relative positions vs SDPA without a bias, over L.

Inference (no grad), fp32, B=1, H=8, D=64, causal, L in --lengths (default 1K .. 64K).

Cases, timed round robin at each L (a case is skipped above its --max-* length):

* ``sdpa-nobias``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` — the
  baseline (ratio 1.0), O(L^2) time (its CPU flash kernel keeps O(L) memory).
* ``linear-scan``: ``relpos.attention(q, k, v, None, causal=True, feature_map="elu1")`` —
  causal linear attention, chunked prefix scan, O(L m Dv).
* ``linear-rope``: the same with ``rope`` (RoFormer eq. 19: features rotated, denominator not).
* ``linear-decay-alibi``: ALiBi as ``c = exp(b)`` on the kernel; its table decays
  geometrically, so it runs as a decayed scan (path ``linear-decay``), O(L m Dv).
* ``linear-fft-kerple``: KERPLE-log (not geometric) as ``c = exp(b)``, Toeplitz by FFT (Luo
  et al. 2021, path ``linear-fft``), elu+1 features (m = 64): O(m Dv L log L).
* ``linear-fft-kerple-prf16``: the same with 16 positive random features (m = 16).

Printed: the table (median ms, ratio vs sdpa-nobias, extra peak MB in a fresh child), the
log-log slope of time vs L per case (least squares over the lengths run: ~1 for O(L), ~1.1
for O(L log L) over 1K..64K, ~2 for O(L^2)), the crossover with sdpa-nobias (the first L
measured where the case is faster, and the L where the two fitted lines cross), and whether
a dense (1, H, L, L) fp32 score matrix — what quadratic attention materialises — would fit in
this machine's memory at the largest L.

Usage: .venv/bin/python benchmarks/bench_linear.py [--quick] [--lengths 1024 2048 ...]
       [--max-sdpa 16384] [--max-fft 16384] [--max-fft-prf 65536]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.nn.functional as F
from _common import (
    MB,
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
    time_once,
    time_round_robin,
    write_json,
)

import relpos
from relpos.attention import plan
from relpos.attention.linear.feature_maps import PositiveRandomFeatures

NAME = "linear"
B, H, D = 1, 8, 64
LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
QUICK_LENGTHS = [512, 1024, 2048]
BASELINE = "sdpa-nobias"
CASES = [
    BASELINE,
    "linear-scan",
    "linear-rope",
    "linear-decay-alibi",
    "linear-fft-kerple",
    "linear-fft-kerple-prf16",
]


def make_inputs(L: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(B, H, L, D, generator=g) for _ in range(3))  # type: ignore[return-value]


def limit(case: str, args) -> int:
    if case == BASELINE:
        return args.max_sdpa
    if case == "linear-fft-kerple":
        return args.max_fft
    if case == "linear-fft-kerple-prf16":
        return args.max_fft_prf
    return 1 << 40


def build_case(case: str, q, k, v) -> tuple[Callable[[], object], dict]:
    if case == BASELINE:
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), {}
    enc, fm = None, "elu1"
    if case == "linear-rope":
        enc = relpos.create("rope", num_heads=H, head_dim=D)
    elif case == "linear-decay-alibi":
        enc = relpos.create("alibi", num_heads=H, head_dim=D)
    elif case.startswith("linear-fft-kerple"):
        torch.manual_seed(0)
        enc = relpos.create("kerple-log", num_heads=H, head_dim=D)
    if case.endswith("prf16"):
        fm = PositiveRandomFeatures(D, 16, seed=0)
    path = plan(q, k, v, enc, causal=True, feature_map=fm)[1]
    return lambda: relpos.attention(q, k, v, enc, causal=True, feature_map=fm), {"path": path}


def run_length(L: int, cases: list[str], args) -> dict:
    q, k, v = make_inputs(L)
    fns, notes, first = {}, {}, {}
    for case in cases:
        fn, note = build_case(case, q, k, v)
        first[case] = time_once(fn)[0]
        fns[case], notes[case] = fn, note
        log(f"  L={L} {case}: first call {first[case]:.2f} s {note}")
    timing = time_round_robin(fns, warmup=0, repeats=args.repeats)
    return {c: {**timing[c], "first_call_s": first[c], **notes[c]} for c in cases}


def slope(points: list[tuple[int, float]]) -> tuple[float, float] | None:
    """Least-squares ``log t = a + b log L``: ``(a, b)``; None with fewer than 2 points."""
    if len(points) < 2:
        return None
    xs = [math.log(L) for L, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - b * mx, b


def crossing(cross: float | None, pts: list[tuple[int, float]]) -> str:
    """The fitted crossover, or why it is not worth printing (more than 16x beyond the
    lengths measured: an extrapolation of noisy slopes)."""
    if cross is None or not pts:
        return "n/a"
    if cross > 16 * pts[-1][0]:
        return f"beyond 16 x {pts[-1][0]} (not reached)"
    return f"{cross:.0f}"


def report(args, info: dict, results: dict, mem: dict) -> str:
    settings = {
        "B": B,
        "H": H,
        "D": D,
        "dtype": "float32",
        "causal": True,
        "grad": "off",
        "lengths": args.lengths,
        "repeats": args.repeats,
        "max_sdpa": args.max_sdpa,
        "max_fft": args.max_fft,
        "max_fft_prf": args.max_fft_prf,
    }
    out = [header("relpos linear: kernelized attention with RPEs vs SDPA", info, settings)]
    out.append(
        "\nms = median of the repeats (cases timed in turn); ratio = ms / ms of "
        f"{BASELINE} at the same L (blank where the baseline was not run); extra peak MB = "
        "steady-state extra peak resident memory of one call in a fresh child process."
    )
    rows = []
    for L in args.lengths:
        base = results[L].get(BASELINE, {}).get("median_s")
        for case, r in results[L].items():
            m = mem.get((case, L), {})
            extra = m.get("extra_mb")
            rows.append(
                [
                    case,
                    L,
                    fmt(r["median_s"] * 1e3, 1),
                    fmt(r["median_s"] / base, 2) if base else "",
                    fmt(extra, 1) if extra is not None else m.get("error", "not measured"),
                    r.get("path", "fused"),
                ]
            )
    out.append("")
    out.append(markdown_table(["case", "L", "ms", "ratio", "extra peak MB", "path"], rows))
    fits = {}
    for case in CASES:
        pts = [(L, results[L][case]["median_s"]) for L in args.lengths if case in results[L]]
        fits[case] = (slope(pts), pts)
    out.append("\n### Growth and crossover\n")
    base_fit = fits[BASELINE][0]
    trows = []
    for case in CASES[1:]:
        fit, pts = fits[case]
        measured = next(
            (L for L, t in pts if BASELINE in results[L] and t < results[L][BASELINE]["median_s"]),
            None,
        )
        cross = None
        if fit is not None and base_fit is not None and base_fit[1] != fit[1]:
            cross = math.exp((fit[0] - base_fit[0]) / (base_fit[1] - fit[1]))
        trows.append(
            [
                case,
                f"{pts[0][0]}..{pts[-1][0]}" if pts else "-",
                fmt(fit[1], 2) if fit else "n/a",
                measured if measured is not None else "none measured",
                crossing(cross, pts),
            ]
        )
    bfit = fits[BASELINE]
    trows.insert(
        0,
        [
            BASELINE,
            f"{bfit[1][0][0]}..{bfit[1][-1][0]}" if bfit[1] else "-",
            fmt(base_fit[1], 2) if base_fit else "n/a",
            "-",
            "-",
        ],
    )
    out.append(
        markdown_table(
            [
                "case",
                "L range",
                "log-log slope",
                "faster than sdpa from L (measured)",
                "crossover L (fitted lines)",
            ],
            trows,
        )
    )
    big = max(args.lengths)
    dense = B * H * big * big * 4 / MB
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / MB
    out.append(
        f"\nAt L={big} a dense (1, {H}, L, L) fp32 score matrix is {dense:,.0f} MB; this "
        f"machine has {total:,.0f} MB of RAM: quadratic attention that materialises scores "
        f"{'cannot' if dense > total else 'can'} run there."
    )
    return "\n".join(out)


def memory_child_main(args) -> None:
    torch.set_grad_enabled(False)
    (L,) = args.lengths
    q, k, v = make_inputs(L)
    fn, _ = build_case(args.case, q, k, v)
    memory_child(fn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, NAME)
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument("--max-sdpa", type=int, default=16384, help="largest L for sdpa")
    parser.add_argument("--max-fft", type=int, default=16384, help="largest L, fft m=64")
    parser.add_argument("--max-fft-prf", type=int, default=65536, help="largest L, fft m=16")
    parser.add_argument(
        "--memory-max",
        type=int,
        default=16384,
        help="largest L measured for memory (the largest L is always measured)",
    )
    args = parser.parse_args()
    if args.lengths is None:
        args.lengths = QUICK_LENGTHS if args.quick else LENGTHS
    args.lengths = sorted(args.lengths)
    finish_args(args, NAME, repeats=3, warmup=0)
    if args.measure_memory:
        memory_child_main(args)
        return
    torch.set_grad_enabled(False)
    info = machine_info()
    mem: dict = {}
    results = {}
    for L in args.lengths:
        cases = [c for c in CASES if L <= limit(c, args)]
        if not args.no_memory and (L <= args.memory_max or L == args.lengths[-1]):
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
            "settings": {"B": B, "H": H, "D": D, "lengths": args.lengths},
            "repeats": args.repeats,
            "results": {str(L): results[L] for L in args.lengths},
            "memory": {f"{c}@{L}": m for (c, L), m in mem.items()},
            "markdown": text,
        },
    )


if __name__ == "__main__":
    main()
