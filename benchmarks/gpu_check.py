"""The engine's GPU cases (flash SDPA, FlexAttention, the folds, auto vs best) in one
prepared run (a few minutes on one CUDA device).

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
baseline.

Then **auto against the best backend** (``relpos_lab.auto_bench``, the grid of ``relpos bench
--auto-vs-best``): for ALiBi, FIRE, KERPLE, T5 and RoPE at ``--auto-lengths``, causal, forward
and training step, fp32 and bf16, ``auto`` and every eligible backend (flash / memory-efficient
SDPA, compiled FlexAttention, the folds, chunked; eager and dense-bias SDPA only below
``DENSE_BIAS_LIMIT``) are timed in interleaved rounds (CUDA-synchronised wall clock), and
the report gives auto / best per call, its distribution and the worst case. No table for
CUDA ships with relpos (it was measured on CPU only), so ``auto`` follows its unmeasured
order there; ``--calibrate PATH`` also measures the representatives of every kind on this
GPU and writes a policy table (``relpos.attention.policy``) that ``auto`` reads when it is
the machine table (``$RELPOS_AUTO_TABLE`` or the default cache path).

Without a CUDA device it prints one line and exits with status 3 (``--device cpu`` runs the
same script on the CPU, to check it; timings there mean nothing for a GPU).

Usage: python benchmarks/gpu_check.py [--lengths 4096 16384] [--auto-lengths 1024 4096]
    [--json runs/bench/gpu.json] [--calibrate runs/bench/cuda_table.json]
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
AUTO_ENCODINGS = ("alibi", "fire", "kerple-log", "t5", "rope")


def sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed(fn, repeats: int = 10) -> float:
    """Median seconds of ``fn`` after two warm-up calls (CUDA events)."""
    for _ in range(2):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        if DEVICE == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


DEVICE = "cuda"


def cases(L: int, dtype: torch.dtype):
    """``name -> (callable, reference output or None, train?)``."""
    g = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, device=DEVICE, generator=g, dtype=dtype) for _ in "qkv")
    alibi = relpos.create("alibi", num_heads=H, head_dim=D).to(DEVICE)
    symmetric = relpos.create("alibi", num_heads=H, head_dim=D, bidirectional=True).to(DEVICE)
    fire = relpos.create("fire", num_heads=H, head_dim=D).to(DEVICE)
    rope = relpos.create("rope", num_heads=H, head_dim=D).to(DEVICE)

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
    parser.add_argument("--auto-lengths", type=int, nargs="*", default=[1024, 4096])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--calibrate",
        type=Path,
        default=None,
        help="also measure every kind's representatives and write a policy table here",
    )
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
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
    payload = {"machine": info, "rows": rows, "markdown": report}
    if args.auto_lengths:
        grid = auto_vs_best(args.auto_lengths, args.dtypes, args.repeats)
        payload["auto_vs_best"] = grid
        print()
        print(grid["markdown"])
        payload["markdown"] += "\n\n" + grid["markdown"]
    if args.calibrate is not None:
        payload["calibration"] = calibrate(args.calibrate, args.dtypes, args.repeats)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(payload, indent=2, default=str))
    if failures:
        print("gpu_check: disagreements: " + "; ".join(failures), file=sys.stderr)
        return 1
    return 0


def auto_vs_best(lengths: list[int], dtypes: list[str], repeats: int) -> dict:
    """``relpos bench --auto-vs-best`` on this device: auto / best per call and overall."""
    from relpos_lab import auto_bench

    plan = auto_bench.GridPlan(
        cases=tuple(auto_bench.EncodingCase(n) for n in AUTO_ENCODINGS),
        lengths=tuple(lengths),
        dtypes=tuple(dtypes),
        masks=(True,),
        modes=(False, True),
        repeats=repeats,
        warmup=2,
        confirm=auto_bench.CONFIRM_ROUNDS,
        device=DEVICE,
        clock="wall",
    )
    result = auto_bench.run_grid(plan, log=lambda m: print(m, file=sys.stderr, flush=True))
    result["summary"] = auto_bench.summarize(result["rows"])
    result["markdown"] = auto_bench.markdown(result, " ".join(sys.argv) + " (auto vs best)")
    return result


def calibrate(path: Path, dtypes: list[str], repeats: int) -> dict:
    """The representatives of every kind on this device; the derived table goes to ``path``."""
    from relpos.attention import policy
    from relpos_lab import auto_bench

    plan = auto_bench.GridPlan(
        cases=auto_bench.CALIBRATION_CASES,
        lengths=(256, 1024, 4096, 16384),
        dtypes=tuple(dtypes),
        masks=(True, False),
        modes=(False, True),
        repeats=repeats,
        warmup=2,
        with_auto=False,
        calibrate=True,
        device=DEVICE,
        clock="wall",
    )
    result = auto_bench.run_grid(plan, log=lambda m: print(m, file=sys.stderr, flush=True))
    command = " ".join(sys.argv)
    table = policy.derive_table(
        auto_bench.calibration_points(result["rows"]),
        auto_bench.calibration_meta(result, command),
    )
    policy.write_table(table, path)
    print(f"gpu_check: wrote the policy table {path} ({len(table.entries)} keys)")
    return result


if __name__ == "__main__":
    sys.exit(main())
