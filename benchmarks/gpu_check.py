"""The GPU cases of issue 12 in one prepared run (a few minutes on one CUDA device).

Checks correctness first, then times each case beside no-bias SDPA on the same device:

* flash SDPA without a bias (``F.scaled_dot_product_attention``, causal): the baseline;
* FlexAttention forward and backward with relpos's ALiBi ``score_mod`` (``backend="flex"``);
* the folded paths: causal ALiBi folded into one extra channel (``backend="fold"``, fp32 and
  bf16 with base-64 position digits), forward and training step; symmetric ALiBi (two passes,
  merged by log-sum-exp; off CPU they form their logits per block: timed at the shorter
  lengths only);
* FIRE above its threshold and RoPE rotate through ``relpos.attention(..., backend="auto")``.

Every output is compared with relpos's chunked backend (float32) before timing; the report
(markdown on stdout, JSON in --json) says which cases agree and the ratio of each to the
baseline. Without a CUDA device it prints one line and exits with status 3.

Usage: python benchmarks/gpu_check.py [--lengths 4096 16384] [--json runs/bench/gpu.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.nn.functional as F
from _common import machine_info

import relpos
from relpos_lab.measure import machine_line

B, H, D = 1, 8, 64


def timed(fn, repeats: int = 10) -> float:
    """Median seconds of ``fn`` after two warm-up calls (CUDA events)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def cases(L: int, dtype: torch.dtype):
    """``name -> (callable, reference output or None, train?)``."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, device="cuda", generator=g, dtype=dtype) for _ in "qkv")
    alibi = relpos.create("alibi", num_heads=H, head_dim=D).cuda()
    symmetric = relpos.create("alibi", num_heads=H, head_dim=D, bidirectional=True).cuda()
    fire = relpos.create("fire", num_heads=H, head_dim=D).cuda()
    rope = relpos.create("rope", num_heads=H, head_dim=D).cuda()

    def train(fn):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]

        def step():
            out = fn(*leaves)
            out.float().sum().backward()
            return out

        return step

    def ref(enc, causal=True):
        with torch.no_grad():
            return relpos.attention(
                q.float(), k.float(), v.float(), enc, causal=causal, backend="chunked"
            )

    out = {
        "sdpa-nobias": (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), None),
        "sdpa-nobias train": (
            train(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
            None,
        ),
        "fold alibi": (
            lambda: relpos.attention(q, k, v, alibi, causal=True, backend="fold"),
            ref(alibi),
        ),
        "fold alibi train": (
            train(lambda q, k, v: relpos.attention(q, k, v, alibi, causal=True, backend="fold")),
            None,
        ),
        "flex alibi": (
            lambda: relpos.attention(q, k, v, alibi, causal=True, backend="flex"),
            ref(alibi),
        ),
        "flex alibi train": (
            train(lambda q, k, v: relpos.attention(q, k, v, alibi, causal=True, backend="flex")),
            None,
        ),
        "auto fire": (lambda: relpos.attention(q, k, v, fire, causal=True), ref(fire)),
        "auto rope": (lambda: relpos.attention(q, k, v, rope, causal=True), None),
    }
    if L <= 4096:
        out["fold symmetric alibi"] = (
            lambda: relpos.attention(q, k, v, symmetric, backend="fold"),
            ref(symmetric, causal=False),
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--json", type=Path, default=Path("runs/bench/gpu_check.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device available (torch.cuda.is_available() is False); "
              "nothing was run", file=sys.stderr)  # fmt: skip
        return 3
    info = machine_info()
    rows, failures = [], []
    t0 = time.perf_counter()
    for dname in args.dtypes:
        dtype = getattr(torch, dname)
        tol = 2e-3 if dtype == torch.float32 else 5e-2
        for L in args.lengths:
            table = cases(L, dtype)
            base = {}
            for name, (fn, expected) in table.items():
                try:
                    seconds = timed(fn)
                    err = None
                    if expected is not None:
                        with torch.no_grad():
                            err = float((fn().float() - expected).abs().max())
                        if err > tol:
                            failures.append(f"{name} {dname} L={L}: max error {err:.3g}")
                    status = "ok" if err is None or err <= tol else "WRONG"
                except Exception as e:  # noqa: BLE001 - report every case, do not stop
                    seconds, err, status = None, None, f"error: {type(e).__name__}: {e}"[:200]
                kind = "train" if name.endswith("train") else "forward"
                if name.startswith("sdpa-nobias"):
                    base[kind] = seconds
                rows.append(dict(case=name, dtype=dname, L=L, s=seconds, err=err, status=status,
                                 kind=kind))  # fmt: skip
                print(f"  {name} {dname} L={L}: {status} {seconds}", file=sys.stderr)
            for r in rows:
                if r["dtype"] == dname and r["L"] == L and r["s"] and base.get(r["kind"]):
                    r["ratio"] = r["s"] / base[r["kind"]]
    lines = [
        "## GPU check (benchmarks/gpu_check.py)",
        "",
        f"- command: `{' '.join(sys.argv)}`",
        f"- machine: {machine_line(info)}",
        f"- B={B}, H={H}, D={D}, causal; ratio = time / no-bias flash SDPA (same kind: "
        f"forward or training step); errors against relpos's chunked backend in float32",
        f"- wall time {time.perf_counter() - t0:.0f} s",
        "",
        "| case | dtype | L | ms | ratio | max err | status |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ms = "-" if r["s"] is None else f"{r['s'] * 1e3:.3f}"
        ratio = f"{r['ratio']:.2f}" if "ratio" in r else "-"
        err = "-" if r["err"] is None else f"{r['err']:.2e}"
        lines.append(f"| {r['case']} | {r['dtype']} | {r['L']} | {ms} | {ratio} | {err} | "
                     f"{r['status']} |")  # fmt: skip
    report = "\n".join(lines)
    print(report)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": info, "rows": rows, "markdown": report}, indent=2))
    if failures:
        print("gpu_check: disagreements: " + "; ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
