"""Sparse + low-rank attention with RoPE (RoLA / RoPeSLR, combined as SLA) vs SDPA, over L.

Inference (no grad; ``--train`` times forward + backward instead), fp32, B=1, H=8, D=64,
bidirectional (video DiTs; ``--causal`` for causal), block 64, 90% sparsity (``--sparsity``),
low-rank bottleneck r = 32. Cases, timed round robin at each L:

* ``sdpa-nobias``: ``F.scaled_dot_product_attention(q, k, v)`` — the baseline (ratio 1.0),
  full attention, no positions.
* ``sdpa-rope``: 3-D RoPE (``rope-axial``, dims=3) applied to q and k, then SDPA: the dense
  model the hybrid replaces.
* ``sparse-only``: the sparse branch alone (RoPE, block selection, block-sparse softmax).
* ``sparse-lowrank-rola``:
``relpos.nn.mixers.sparse_lowrank.sparse_lowrank_attention(lowrank="rola")``.
* ``sparse-lowrank-ropeslr``: the same with RoPeSLR's absolute-PE low-rank branch.
* ``sparse-lowrank-rola-ckpt`` (``--train`` only): RoLA with ``checkpoint_chunks=True``.

Positions are a 3-D grid (T, 16, 16) with T = L / 256 (``grid_positions``). Printed: the
table (median ms, ratio vs sdpa-nobias, extra peak MB in a fresh child), the realised block
density, and the log-log slope of time vs L per case.

Usage: .venv/bin/python benchmarks/bench_sparse_lowrank.py [--quick] [--lengths 1024 ...]
       [--sparsity 0.9] [--block 64] [--rank 32] [--causal] [--train]
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
from relpos.attention.linear.feature_maps import HeadwiseLowRankFeatures, LowRankFeatures
from relpos.nn.mixers.ropeslr import GridPositionEmbedding
from relpos.nn.mixers.sparse_lowrank import (
    block_sparse_attention,
    rotate_queries_keys,
    select_blocks,
    sparse_lowrank_attention,
)
from relpos.positions_nd import grid_positions

NAME = "sparse_lowrank"
B, H, D = 1, 8, 64
SIDE = 16  # the grid is (L / SIDE^2, SIDE, SIDE)
LENGTHS = [1024, 2048, 4096, 8192, 16384]
QUICK_LENGTHS = [512, 1024]
BASELINE = "sdpa-nobias"
CASES = [BASELINE, "sdpa-rope", "sparse-only", "sparse-lowrank-rola", "sparse-lowrank-ropeslr"]
#: training only: the RoLA hybrid with ``checkpoint_chunks=True``
CKPT = "sparse-lowrank-rola-ckpt"


def cases_for(args) -> list[str]:
    return [*CASES, CKPT] if args.train else list(CASES)


def make_inputs(L: int, train: bool) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g, requires_grad=train) for _ in range(3))
    return q, k, v


def grid(L: int) -> tuple[torch.Tensor, tuple[int, int, int]]:
    t = max(1, math.ceil(L / (SIDE * SIDE)))
    return grid_positions(t, SIDE, SIDE)[:L], (t, SIDE, SIDE)


def build_case(case: str, q, k, v, args) -> tuple[Callable[[], object], dict]:
    L = q.shape[2]
    pos, size = grid(L)
    torch.manual_seed(0)
    enc = relpos.create("rope-axial", num_heads=H, head_dim=D, dims=3)
    kw = dict(block_size=args.block, sparsity=args.sparsity, causal=args.causal)
    note: dict = {}
    if case == BASELINE:

        def fn():
            return F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
    elif case == "sdpa-rope":
        p = pos[None]

        def fn():
            rq, rk = enc.rotate_qk(q, k, p, p)
            return F.scaled_dot_product_attention(rq, rk, v, is_causal=args.causal)
    elif case == "sparse-only":

        def fn():
            rq, rk, _ = rotate_queries_keys(enc, q, k, pos, 3)
            sel = select_blocks(rq, rk, **kw)
            return block_sparse_attention(rq, rk, v, sel)
    else:
        lowrank = "rola" if case == CKPT else case.rsplit("-", 1)[1]
        ckpt = case == CKPT
        if lowrank == "rola":
            fmap, pe = LowRankFeatures(D, args.rank, seed=0), None
        else:
            fmap = HeadwiseLowRankFeatures(H, D, args.rank, seed=0)
            pe = GridPositionEmbedding(H, D, size, seed=0)
        proj = torch.nn.Linear(D, D, bias=False)

        def fn():
            return sparse_lowrank_attention(
                q,
                k,
                v,
                enc,
                fmap,
                pos=pos,
                lowrank=lowrank,
                position_embedding=pe,
                projection=proj,
                checkpoint_chunks=ckpt,
                **kw,
            )

    if case.startswith("sparse"):
        with torch.no_grad():
            rq, rk, _ = rotate_queries_keys(enc, q, k, pos, 3)
            note["density"] = select_blocks(rq, rk, **kw).density()
    if not args.train:
        return fn, note

    def step():
        out = fn()
        out.sum().backward()
        for t in (q, k, v):
            t.grad = None

    return step, note


def run_length(L: int, cases: list[str], args) -> dict:
    q, k, v = make_inputs(L, args.train)
    fns, notes, first = {}, {}, {}
    for case in cases:
        fn, note = build_case(case, q, k, v, args)
        first[case] = time_once(fn)[0]
        fns[case], notes[case] = fn, note
        log(f"  L={L} {case}: first call {first[case]:.2f} s {note}")
    timing = time_round_robin(fns, warmup=0, repeats=args.repeats)
    return {c: {**timing[c], "first_call_s": first[c], **notes[c]} for c in cases}


def slope(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of ``log t`` against ``log L``."""
    if len(points) < 2:
        return None
    xs = [math.log(L) for L, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def report(args, info: dict, results: dict, mem: dict) -> str:
    settings = {
        "B": B,
        "H": H,
        "D": D,
        "dtype": "float32",
        "causal": args.causal,
        "mode": "forward+backward" if args.train else "forward (no grad)",
        "block": args.block,
        "sparsity": args.sparsity,
        "rank": args.rank,
        "grid": f"(L/{SIDE * SIDE}, {SIDE}, {SIDE})",
        "lengths": args.lengths,
        "repeats": args.repeats,
    }
    out = [header("relpos sparse + low-rank attention (RoLA, RoPeSLR) vs SDPA", info, settings)]
    out.append(
        "\nms = median of the repeats (cases timed in turn); ratio = ms / ms of "
        f"{BASELINE} at the same L; density = covered fraction of the blocks; extra peak MB "
        "= steady-state extra peak resident memory of one call in a fresh child process."
    )
    rows = []
    for L in args.lengths:
        base = results[L][BASELINE]["median_s"]
        for case, r in results[L].items():
            m = mem.get((case, L), {})
            extra = m.get("extra_mb")
            rows.append(
                [
                    case,
                    L,
                    fmt(r["median_s"] * 1e3, 1),
                    fmt(r["median_s"] / base, 2),
                    fmt(r["density"], 3) if "density" in r else "",
                    fmt(extra, 1) if extra is not None else m.get("error", "not measured"),
                ]
            )
    out.append("")
    out.append(markdown_table(["case", "L", "ms", "ratio", "density", "extra peak MB"], rows))
    srows = []
    for case in cases_for(args):
        pts = [(L, results[L][case]["median_s"]) for L in args.lengths]
        s = slope(pts)
        srows.append([case, f"{pts[0][0]}..{pts[-1][0]}", fmt(s, 2) if s is not None else "n/a"])
    out.append("\n### Growth\n")
    out.append(markdown_table(["case", "L range", "log-log slope"], srows))
    return "\n".join(out)


def memory_child_main(args) -> None:
    torch.set_grad_enabled(args.train)
    (L,) = args.lengths
    q, k, v = make_inputs(L, args.train)
    fn, _ = build_case(args.case, q, k, v, args)
    memory_child(fn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, NAME)
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument("--sparsity", type=float, default=0.9)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--train", action="store_true", help="forward + backward")
    args = parser.parse_args()
    if args.lengths is None:
        args.lengths = QUICK_LENGTHS if args.quick else LENGTHS
    args.lengths = sorted(args.lengths)
    finish_args(args, NAME + ("-train" if args.train else ""), repeats=3, warmup=0)
    if args.measure_memory:
        memory_child_main(args)
        return
    torch.set_grad_enabled(args.train)
    info = machine_info()
    flags = [
        *child_args(),
        "--sparsity",
        str(args.sparsity),
        "--block",
        str(args.block),
        "--rank",
        str(args.rank),
        *(["--causal"] if args.causal else []),
        *(["--train"] if args.train else []),
    ]
    mem: dict = {}
    results = {}
    for L in args.lengths:
        if not args.no_memory:
            for case in cases_for(args):
                m = measure_memory(__file__, case, [*flags, "--lengths", str(L)])
                mem[(case, L)] = m
                log(f"memory L={L} {case}: {m}")
        log(f"timing L={L}")
        results[L] = run_length(L, cases_for(args), args)
    info["loadavg_end"] = list(os.getloadavg())
    text = report(args, info, results, mem)
    print(text)
    write_json(
        args.json,
        {
            "benchmark": NAME,
            "machine": info,
            "settings": {"B": B, "H": H, "D": D, "lengths": args.lengths, "train": args.train},
            "repeats": args.repeats,
            "results": {str(L): results[L] for L in args.lengths},
            "memory": {f"{c}@{L}": m for (c, L), m in mem.items()},
            "markdown": text,
        },
    )


if __name__ == "__main__":
    main()
