"""Training step of relative-embedding attention (Shaw, Music Transformer): relpos vs the
naive O(L^2 D) gather.

fp32, B=1, H=8, D=64, causal, L in --lengths (2048 4096). One step = drop the old gradients,
forward, ``loss = (out * g).sum()`` with a fixed random ``g``, backward into q, k, v and the
relative tables. Cases:

* ``shaw-k64``: Shaw et al. 2018 with keys and values, clipping distance 64, tables shared by
  the heads (``relpos.create("shaw", max_relative_position=64)``);
* ``music-unclipped``: Music Transformer relative attention, ``E_r`` with L rows (every
  distance has its own embedding), keys only, heads sharing ``E_r``
  (``heads_share=True``: the naive gather is then ``(L, L, D)`` as for Shaw; per-head tables
  would make it H times larger).

Implementations:

* ``naive`` (baseline, the obvious way): ``a = E[row(j - i)]`` gathered into ``(L, L, D)``
  tensors, ``logits = (q k^T + einsum("bhid,ijd->bhij", q, a^K)) * scale``, causal mask,
  softmax, ``out = p v + einsum("bhij,ijd->bhid", p, a^V)``.
* ``relpos``: ``relpos.attention(q, k, v, enc, causal=True)`` with ``backend="auto"``: the
  chunked backend above ``DENSE_BIAS_LIMIT``, its probability path for Shaw (value term), its
  tile path for the keys-only Music Transformer; ``q @ E^T`` over the rows in ``prepare``
  (O(L R)), no ``(L, L, D)`` tensor.

Reports seconds per step (median), the ratio relpos / naive, the extra peak memory of one step
in fresh child processes and the ratio naive / relpos. A naive step whose estimated peak
(``naive_estimate_bytes``, fitted to measured runs at L = 1024 and 1536) exceeds
``--naive-limit-gb`` (16) is not run: the table says "OOM by estimate" with the estimate.
Before timing, outputs and gradients of both are compared once at --check-length (1024,
where ``auto`` already picks the chunked backend).

Usage: .venv/bin/python benchmarks/bench_shaw.py [--quick] [--lengths 2048 4096]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
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

NAME = "shaw"
B, H, D = 1, 8, 64
LENGTHS = [2048, 4096]
QUICK_LENGTHS = [512, 1024]
CASES = ["shaw-k64", "music-unclipped"]
IMPLS = ["naive", "relpos"]
SHAW_K = 64
FLOAT = 4  # bytes


def make_encoding(case: str, L: int) -> relpos.Encoding:
    torch.manual_seed(0)
    if case == "shaw-k64":
        return relpos.create("shaw", num_heads=H, head_dim=D, max_relative_position=SHAW_K)
    if case == "music-unclipped":
        return relpos.create(
            "music-transformer", num_heads=H, head_dim=D, max_relative_position=L, heads_share=True
        )
    raise ValueError(f"unknown case {case!r}; cases: {CASES}")


def naive_estimate_bytes(case: str, L: int) -> int:
    """Peak extra memory of one naive step, fitted to measured steps at L = 1024 and 1536
    (VmHWM, this script's memory children; within 3%): about 1.1 ``(L, L, D)`` tensors per
    gathered table (2 for Shaw's keys and values, 1 for the Music Transformer's keys) and ten
    ``(B, H, L, L)`` logit-sized tensors, in float32."""
    tables = 2 if case == "shaw-k64" else 1
    return int((1.1 * tables * L * L * D + 10 * B * H * L * L) * FLOAT)


class Problem:
    """Inputs of one training step: encoding, leaf q, k, v, and the fixed output weights g."""

    def __init__(self, case: str, L: int) -> None:
        self.case, self.L = case, L
        self.enc = make_encoding(case, L)
        gen = torch.Generator().manual_seed(1)
        self.q, self.k, self.v = (
            torch.randn(B, H, L, D, generator=gen).requires_grad_() for _ in range(3)
        )
        self.g = torch.randn(B, H, L, D, generator=gen)

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


def naive_forward(p: Problem) -> torch.Tensor:
    """The O(L^2 D) formulation: relative embeddings gathered per (query, key) pair."""
    L, enc = p.L, p.enc
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    if p.case == "shaw-k64":
        rows = (j - i).clamp(-SHAW_K, SHAW_K) + SHAW_K
        a_k, a_v = enc.key_table[rows], enc.value_table[rows]  # (L, L, D) each
    else:  # E_r rows for relative positions -(L-1) .. 0; keys after the query are masked
        a_k, a_v = enc.key_table[(j - i + L - 1).clamp(0, L - 1)], None
    logits = torch.matmul(p.q, p.k.transpose(-1, -2)) + torch.einsum("bhid,ijd->bhij", p.q, a_k)
    logits = (logits * D**-0.5).masked_fill(j > i, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    out = torch.matmul(probs, p.v)
    if a_v is not None:
        out = out + torch.einsum("bhij,ijd->bhid", probs, a_v)
    return out


def forward(impl: str, p: Problem) -> torch.Tensor:
    if impl == "naive":
        return naive_forward(p)
    if impl == "relpos":
        return relpos.attention(p.q, p.k, p.v, p.enc, causal=True)
    raise ValueError(f"unknown impl {impl!r}; impls: {IMPLS}")


def relpos_path(p: Problem) -> str:
    """The backend ``auto`` picks for this problem, and the chunked path it takes."""
    name, path = plan(p.q.detach(), p.k.detach(), p.v.detach(), p.enc, causal=True)
    if name == "chunked":
        name += f" ({path} path)"
    return name


def make_step(impl: str, p: Problem) -> Callable[[], None]:
    def step() -> None:
        p.zero_grad()
        out = forward(impl, p)
        (out * p.g).sum().backward()

    return step


def agreement(case: str, L: int) -> list[dict]:
    """Max relative difference (max |relpos - naive| / max |naive|) of the output and of
    every gradient, from identical inputs and parameters."""
    outs, grads = {}, {}
    for impl in IMPLS:
        p = Problem(case, L)
        out = forward(impl, p)
        (out * p.g).sum().backward()
        outs[impl] = out.detach()
        grads[impl] = {n: t.grad for n, t in p.leaves().items()}

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))

    rows = [{"tensor": "output", "rel": rel(outs["relpos"], outs["naive"])}]
    for name, ref in grads["naive"].items():
        rows.append({"tensor": f"grad {name}", "rel": rel(grads["relpos"][name], ref)})
    return rows


# ------------------------------------------------------------------------------ runs
def naive_fits(case: str, L: int, args) -> bool:
    return naive_estimate_bytes(case, L) <= args.naive_limit_gb * 1e9


def run_case(case: str, L: int, args) -> dict:
    p = Problem(case, L)
    impls = [i for i in IMPLS if i != "naive" or naive_fits(case, L, args)]
    steps = {impl: make_step(impl, p) for impl in impls}
    first = {impl: time_once(steps[impl])[0] for impl in impls}
    timing = time_round_robin(steps, warmup=args.warmup, repeats=args.repeats)
    for impl in impls:
        timing[impl]["first_call_s"] = first[impl]
        log(f"  {case} L={L} {impl}: {timing[impl]['median_s']:.3f} s/step")
    timing["relpos_path"] = relpos_path(p)
    return timing


def _oom(case: str, L: int) -> str:
    return f"OOM by estimate ({naive_estimate_bytes(case, L) / 1e9:.1f} GB)"


def report(args, info: dict, results: dict, mem: dict, checks: dict) -> str:
    settings = {
        "B": B,
        "H": H,
        "D": D,
        "dtype": "float32",
        "causal": True,
        "lengths": args.lengths,
        "cases": args.cases,
        "shaw k": SHAW_K,
        "loss": "(out * g).sum(), g fixed random",
        "warmup": args.warmup,
        "repeats": args.repeats,
        "naive limit": f"{args.naive_limit_gb:g} GB (estimated peak)",
    }
    out = [
        header(
            "relpos relative-embedding attention, training step: relpos vs naive", info, settings
        )
    ]
    out.append(
        "\ns/step = median seconds per forward + backward (implementations timed in turn); "
        "time ratio = relpos / naive; extra MB = steady-state extra peak resident memory of one "
        "step in a fresh child process (1 MB = 10^6 bytes); memory ratio = naive / relpos; "
        "naive estimate = naive_estimate_bytes (1.1 (L, L, D) tensors per gathered table and ten "
        "logit-sized tensors, fitted to measured steps)."
    )
    rows = []
    for case in args.cases:
        for L in args.lengths:
            r = results[(case, L)]
            fits = "naive" in r
            t_ratio = r["relpos"]["median_s"] / r["naive"]["median_s"] if fits else None
            mn = mem.get(("naive", case, L), {})
            mr = mem.get(("relpos", case, L), {})
            en, er = mn.get("extra_mb"), mr.get("extra_mb")
            m_ratio = en / er if en is not None and er else None
            if not fits:
                naive_mem = naive_time = _oom(case, L)
            else:
                naive_time = fmt(r["naive"]["median_s"], 3)
                naive_mem = fmt(en, 1) if en is not None else mn.get("error", "not measured")
            rows.append(
                [
                    case,
                    L,
                    r["relpos_path"],
                    naive_time,
                    fmt(r["relpos"]["median_s"], 3),
                    fmt(t_ratio, 2),
                    naive_mem,
                    fmt(er, 1) if er is not None else mr.get("error", "not measured"),
                    fmt(m_ratio, 1),
                    fmt(naive_estimate_bytes(case, L) / MB, 0),
                ]
            )
    out.append("")
    out.append(
        markdown_table(
            [
                "case",
                "L",
                "relpos backend",
                "naive s/step",
                "relpos s/step",
                "time ratio",
                "naive extra MB",
                "relpos extra MB",
                "memory ratio",
                "naive estimate MB",
            ],
            rows,
        )
    )
    out.append(f"\n### Agreement at L={args.check_length} (max |relpos - naive| / max |naive|)\n")
    crow = [
        [case, row["tensor"], f"{row['rel']:.1e}"] for case in args.cases for row in checks[case]
    ]
    out.append(markdown_table(["case", "tensor", "max rel diff"], crow))
    return "\n".join(out)


def memory_child_main(args) -> None:
    impl, case = args.case.split(":")
    (L,) = args.lengths
    p = Problem(case, L)
    memory_child(make_step(impl, p), before_baseline=p.zero_grad)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, NAME)
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument(
        "--check-length",
        type=int,
        default=1024,
        help="length of the agreement check (1024: relpos runs its chunked path there)",
    )
    parser.add_argument(
        "--naive-limit-gb",
        type=float,
        default=16.0,
        help="skip naive steps whose estimated peak memory exceeds this (GB, 10^9 bytes)",
    )
    parser.add_argument(
        "--cases", nargs="+", choices=CASES, default=CASES, help="cases to run (default: all)"
    )
    args = parser.parse_args()
    if args.lengths is None:
        args.lengths = QUICK_LENGTHS if args.quick else LENGTHS
    args.lengths = sorted(args.lengths)
    finish_args(args, NAME, repeats=5, warmup=1)
    if args.measure_memory:
        memory_child_main(args)
        return
    info = machine_info()
    checks = {case: agreement(case, args.check_length) for case in args.cases}
    log(f"agreement at L={args.check_length}: {checks}")
    mem: dict = {}
    if not args.no_memory:
        for case in args.cases:
            for L in args.lengths:
                for impl in IMPLS:
                    if impl == "naive" and not naive_fits(case, L, args):
                        mem[(impl, case, L)] = {"error": _oom(case, L)}
                        continue
                    m = measure_memory(
                        __file__,
                        f"{impl}:{case}",
                        [*child_args(), "--lengths", str(L), "--no-memory"],
                    )
                    mem[(impl, case, L)] = m
                    log(f"memory {impl} {case} L={L}: {m}")
    results = {}
    for case in args.cases:
        for L in args.lengths:
            results[(case, L)] = run_case(case, L, args)
    info["loadavg_end"] = list(os.getloadavg())
    text = report(args, info, results, mem, checks)
    print(text)
    write_json(
        args.json,
        {
            "benchmark": NAME,
            "machine": info,
            "settings": {"B": B, "H": H, "D": D, "lengths": args.lengths, "shaw_k": SHAW_K},
            "warmup": args.warmup,
            "repeats": args.repeats,
            "naive_limit_gb": args.naive_limit_gb,
            "naive_estimate_bytes": {
                f"{c}@{L}": naive_estimate_bytes(c, L) for c in args.cases for L in args.lengths
            },
            "results": {f"{c}@{L}": r for (c, L), r in results.items()},
            "memory": {f"{i}:{c}@{L}": m for (i, c, L), m in mem.items()},
            "agreement": {"L": args.check_length, **checks},
            "markdown": text,
        },
    )


if __name__ == "__main__":
    main()
