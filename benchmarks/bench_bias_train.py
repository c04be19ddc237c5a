"""Training step (forward + backward) of learnable biases: relpos chunked vs a dense bias.

fp32, B=1, H=8, D=64, causal, L in --lengths (2048 4096), learnable ``t5`` and
``kerple-log``. One step = drop the old gradients, forward, ``loss = (out * g).sum()`` with a
fixed random ``g``, backward into q, k, v and the encoding's parameters.

* ``dense`` (baseline): the bias materialised from the encoding over the full index grid,
  ``enc.bias_at_distance(arange(H)[:, None, None], i[:, None] - i[None, :])``, ``-inf`` above the
  diagonal, then ``F.scaled_dot_product_attention(q, k, v, attn_mask=bias)``; gradients flow
  into the encoding through the bias.
* ``chunked``: ``relpos.attention(q, k, v, enc, causal=True, backend="chunked")`` (the Toeplitz
  path: a per-distance table, custom autograd, O(L) memory).

Reports seconds per step (median), the ratio chunked / dense, the extra peak memory of one
step in fresh child processes and the ratio dense / chunked. Targets (from the issue):
chunked not slower than dense (ratio <= 1.0) and at least 8x less additional peak memory.
Before timing, the gradients of both are compared once at L=1024 (max relative difference:
max |chunked - dense| / max |dense| per tensor).

Usage: .venv/bin/python benchmarks/bench_bias_train.py [--quick] [--lengths 2048 4096]
"""

from __future__ import annotations

import argparse
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
    met,
    time_once,
    time_round_robin,
    write_json,
)

import relpos

NAME = "bias_train"
B, H, D = 1, 8, 64
LENGTHS = [2048, 4096]
QUICK_LENGTHS = [512, 1024]
ENCODINGS = ["t5", "kerple-log"]
IMPLS = ["dense", "chunked"]
CHECK_L = 1024
TARGET_TIME_RATIO = 1.0  # chunked / dense
TARGET_MEMORY_RATIO = 8.0  # dense / chunked


class Problem:
    """Inputs of one training step: encoding, leaf q, k, v, and the fixed output weights g."""

    def __init__(self, encoding: str, L: int) -> None:
        torch.manual_seed(0)
        self.enc = relpos.create(encoding, num_heads=H, head_dim=D)
        gen = torch.Generator().manual_seed(1)
        self.q, self.k, self.v = (
            torch.randn(B, H, L, D, generator=gen).requires_grad_() for _ in range(3)
        )
        self.g = torch.randn(B, H, L, D, generator=gen)
        self.L = L

    def leaves(self) -> dict[str, torch.Tensor]:
        return {
            "q": self.q,
            "k": self.k,
            "v": self.v,
            **{f"enc.{n}": p for n, p in self.enc.named_parameters()},
        }

    def zero_grad(self) -> None:
        for t in self.leaves().values():
            t.grad = None


def dense_bias(enc, L: int) -> torch.Tensor:
    """(1, H, L, L): the encoding's bias over the full grid, ``-inf`` above the diagonal."""
    i = torch.arange(L)
    d = i[:, None] - i[None, :]
    h = torch.arange(H)[:, None, None]
    return enc.bias_at_distance(h, d).masked_fill(d < 0, float("-inf"))[None]


def forward(impl: str, p: Problem) -> torch.Tensor:
    if impl == "dense":
        return F.scaled_dot_product_attention(p.q, p.k, p.v, attn_mask=dense_bias(p.enc, p.L))
    if impl == "chunked":
        return relpos.attention(p.q, p.k, p.v, p.enc, causal=True, backend="chunked")
    raise ValueError(f"unknown impl {impl!r}; impls: {IMPLS}")


def make_step(impl: str, p: Problem) -> Callable[[], None]:
    def step() -> None:
        p.zero_grad()
        out = forward(impl, p)
        (out * p.g).sum().backward()

    return step


def gradient_check(encoding: str, L: int) -> list[dict]:
    """Max relative difference (max |chunked - dense| / max |dense|) of the output and of every
    gradient, from identical inputs and parameters."""
    grads, outs = {}, {}
    for impl in IMPLS:
        p = Problem(encoding, L)
        out = forward(impl, p)
        (out * p.g).sum().backward()
        outs[impl] = out.detach()
        grads[impl] = {n: t.grad for n, t in p.leaves().items()}

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))

    rows = [{"tensor": "output", "max_abs": float(outs["dense"].abs().max())}]
    rows[0]["rel"] = rel(outs["chunked"], outs["dense"])
    for name, ref in grads["dense"].items():
        got = grads["chunked"][name]
        row = {"tensor": f"grad {name}", "max_abs": None, "rel": None}
        if ref is None or got is None:
            row["missing"] = [i for i in IMPLS if grads[i][name] is None]
        else:
            row.update(max_abs=float(ref.abs().max()), rel=rel(got, ref))
        rows.append(row)
    return rows


# ------------------------------------------------------------------------------ runs
def run_pair(encoding: str, L: int, args) -> dict:
    p = Problem(encoding, L)
    steps = {impl: make_step(impl, p) for impl in IMPLS}
    first = {impl: time_once(steps[impl])[0] for impl in IMPLS}
    timing = time_round_robin(steps, warmup=args.warmup, repeats=args.repeats)
    for impl in IMPLS:
        timing[impl]["first_call_s"] = first[impl]
        log(f"  {encoding} L={L} {impl}: {timing[impl]['median_s']:.3f} s/step")
    return timing


def report(args, info: dict, results: dict, mem: dict, checks: dict) -> str:
    settings = {
        "B": B,
        "H": H,
        "D": D,
        "dtype": "float32",
        "causal": True,
        "lengths": args.lengths,
        "encodings": ENCODINGS,
        "loss": "(out * g).sum(), g fixed random",
        "warmup": args.warmup,
        "repeats": args.repeats,
    }
    out = [header("relpos bias training step: chunked vs dense bias", info, settings)]
    out.append(
        "\ns/step = median seconds per forward + backward (dense and chunked timed in turn); "
        "time ratio = chunked / dense; extra MB = steady-state extra peak resident memory of "
        "one step in a fresh child process (1 MB = 10^6 bytes); memory ratio = dense / chunked."
    )
    rows, trows = [], []
    for enc in ENCODINGS:
        for L in args.lengths:
            r = results[(enc, L)]
            t_ratio = r["chunked"]["median_s"] / r["dense"]["median_s"]
            md = mem.get(("dense", enc, L), {})
            mc = mem.get(("chunked", enc, L), {})
            ed, ec = md.get("extra_mb"), mc.get("extra_mb")
            m_ratio = ed / ec if ed is not None and ec else None
            rows.append(
                [
                    enc,
                    L,
                    fmt(r["dense"]["median_s"], 3),
                    fmt(r["chunked"]["median_s"], 3),
                    fmt(t_ratio, 2),
                    fmt(ed, 1) if ed is not None else md.get("error", "not measured"),
                    fmt(ec, 1) if ec is not None else mc.get("error", "not measured"),
                    fmt(m_ratio, 1),
                ]
            )
            trows.append(
                [
                    enc,
                    L,
                    fmt(t_ratio, 2),
                    met(t_ratio <= TARGET_TIME_RATIO),
                    fmt(m_ratio, 1),
                    met(None if m_ratio is None else m_ratio >= TARGET_MEMORY_RATIO),
                ]
            )
    out.append("")
    out.append(
        markdown_table(
            [
                "encoding",
                "L",
                "dense s/step",
                "chunked s/step",
                "time ratio",
                "dense extra MB",
                "chunked extra MB",
                "memory ratio",
            ],
            rows,
        )
    )
    out.append(
        f"\n### Targets: time ratio <= {TARGET_TIME_RATIO}, memory ratio >= "
        f"{TARGET_MEMORY_RATIO:g}\n"
    )
    out.append(
        markdown_table(["encoding", "L", "time ratio", "speed", "memory ratio", "memory"], trows)
    )
    out.append(f"\n### Gradient agreement at L={CHECK_L} (max |chunked - dense| / max |dense|)\n")
    crow = []
    for enc in ENCODINGS:
        for row in checks[enc]:
            rel = row["rel"]
            crow.append(
                [
                    enc,
                    row["tensor"],
                    fmt(row["max_abs"], 4) if row["max_abs"] is not None else "n/a",
                    f"{rel:.1e}" if rel is not None else f"no gradient in {row['missing']}",
                ]
            )
    out.append(markdown_table(["encoding", "tensor", "max |dense|", "max rel diff"], crow))
    return "\n".join(out)


def memory_child_main(args) -> None:
    impl, encoding = args.case.split(":")
    (L,) = args.lengths
    p = Problem(encoding, L)
    memory_child(make_step(impl, p), before_baseline=p.zero_grad)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, NAME)
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    args = parser.parse_args()
    if args.lengths is None:
        args.lengths = QUICK_LENGTHS if args.quick else LENGTHS
    args.lengths = sorted(args.lengths)
    finish_args(args, NAME, repeats=5, warmup=1)
    if args.measure_memory:
        memory_child_main(args)
        return
    info = machine_info()
    checks = {enc: gradient_check(enc, CHECK_L) for enc in ENCODINGS}
    log(f"gradient check at L={CHECK_L}: {checks}")
    mem: dict = {}
    if not args.no_memory:
        for enc in ENCODINGS:
            for L in args.lengths:
                for impl in IMPLS:
                    m = measure_memory(
                        __file__, f"{impl}:{enc}", [*child_args(), "--lengths", str(L)]
                    )
                    mem[(impl, enc, L)] = m
                    log(f"memory {impl} {enc} L={L}: {m}")
    results = {}
    for enc in ENCODINGS:
        for L in args.lengths:
            results[(enc, L)] = run_pair(enc, L, args)
    info["loadavg_end"] = list(os.getloadavg())
    text = report(args, info, results, mem, checks)
    print(text)
    write_json(
        args.json,
        {
            "benchmark": NAME,
            "machine": info,
            "settings": {"B": B, "H": H, "D": D, "lengths": args.lengths},
            "warmup": args.warmup,
            "repeats": args.repeats,
            "results": {f"{enc}@{L}": r for (enc, L), r in results.items()},
            "memory": {f"{i}:{e}@{L}": m for (i, e, L), m in mem.items()},
            "gradient_check": {"L": CHECK_L, **checks},
            "markdown": text,
        },
    )


if __name__ == "__main__":
    main()
