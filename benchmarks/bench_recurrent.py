"""GateLoop and LightNet (relpos.efficient): linear time in L, O(1) decoding per token.

fp32, B=1, H=8, D=64 (Dk = Dv = 64), causal, gradients off. Cases, timed in turn at each
length (round robin, ``_common.time_round_robin``):

* ``sdpa``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` without a bias: the
  quadratic baseline (ratio base 1.0).
* ``gateloop``: ``gateloop_scan(q, k, v, amplitude, phase)``, chunked mode (chunk 64),
  amplitude ``sigmoid(N(3, 1))``, phase ``relu(N(0, 0.1))``.
* ``lightnet``: ``lightnet_scan(q, k, v)`` (additive recurrence, null slot), chunked.

Prints the time per case, the ratio to ``sdpa`` at the same length, and the log-log slope of
time against L fitted over the lengths (1 = linear, 2 = quadratic).

Decoding: after a prefill of P tokens (P in --decode-prefixes), the time of one token:
``gateloop_scan(..., mode="recurrent", state=...)`` and ``lightnet_scan(..., state=...)``
against SDPA of one query over a KV cache of P keys. A state-based decoder is O(1) per token
(flat in P); the cache is O(P).

Usage: .venv/bin/python benchmarks/bench_recurrent.py [--quick] [--lengths 1024 4096 ...]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.nn.functional as F
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

from relpos.nn.mixers.gateloop import gateloop_scan
from relpos.nn.mixers.lightnet import lightnet_scan

NAME = "bench_recurrent"
B, H, D = 1, 8, 64
LENGTHS = [1024, 2048, 4096, 8192, 16384]
QUICK_LENGTHS = [512, 1024, 2048, 4096]
PREFIXES = [256, 4096, 16384]
QUICK_PREFIXES = [256, 2048]
CASES = ("sdpa", "gateloop", "lightnet")


def inputs(L: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g) for _ in range(3))
    amplitude = torch.sigmoid(torch.randn(B, H, L, D, generator=g) + 3)
    phase = torch.relu(torch.randn(B, H, L, D, generator=g)) * 0.1
    return {"q": q, "k": k, "v": v, "amplitude": amplitude, "phase": phase}


def cases(x: dict[str, torch.Tensor]) -> dict:
    q, k, v = x["q"], x["k"], x["v"]
    return {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "gateloop": lambda: gateloop_scan(q, k, v, x["amplitude"], x["phase"]),
        "lightnet": lambda: lightnet_scan(q, k, v),
    }


def decode_cases(P: int) -> dict:
    x = inputs(P + 1)
    q, k, v, a, p = (x[n] for n in ("q", "k", "v", "amplitude", "phase"))
    head = slice(0, P)
    _, gl_state = gateloop_scan(
        q[:, :, head],
        k[:, :, head],
        v[:, :, head],
        a[:, :, head],
        p[:, :, head],
        return_state=True,
    )
    _, ln_state = lightnet_scan(q[:, :, head], k[:, :, head], v[:, :, head], return_state=True)
    t = slice(P, P + 1)
    return {
        "sdpa-kv-cache": lambda: F.scaled_dot_product_attention(q[:, :, t], k, v),
        "gateloop-step": lambda: gateloop_scan(
            q[:, :, t],
            k[:, :, t],
            v[:, :, t],
            a[:, :, t],
            p[:, :, t],
            mode="recurrent",
            state=gl_state,
            return_state=True,
        ),
        "lightnet-step": lambda: lightnet_scan(
            q[:, :, t],
            k[:, :, t],
            v[:, :, t],
            mode="recurrent",
            state=ln_state,
            return_state=True,
        ),
    }


def slope(lengths: list[int], times: list[float]) -> float:
    """Least-squares slope of log(time) against log(L)."""
    xs, ys = [math.log(L) for L in lengths], [math.log(t) for t in times]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def report(args, info, results, decode) -> str:
    settings = {"B": B, "H": H, "D": D, "dtype": "float32", "causal": True, "chunk": 64}
    settings.update(warmup=args.warmup, repeats=args.repeats)
    parts = [header("GateLoop / LightNet: time over L, decoding per token", info, settings), ""]
    rows = []
    for L in args.lengths:
        base = results[L]["sdpa"]["median_s"]
        rows.append(
            [L]
            + [fmt(results[L][c]["median_s"] * 1e3, 1) for c in CASES]
            + [fmt(results[L][c]["median_s"] / base) for c in CASES[1:]]
        )
    heads = ["L"] + [f"{c} ms" for c in CASES] + [f"{c} / sdpa" for c in CASES[1:]]
    parts += [markdown_table(heads, rows), ""]
    slopes = {}
    for stat in ("median_s", "min_s"):
        times = {c: [results[L][c][stat] for L in args.lengths] for c in CASES}
        slopes[stat] = {c: slope(args.lengths, t) for c, t in times.items()}
        parts.append(
            f"log-log slope of the {stat[:-2]} time over L: "
            + ", ".join(f"{c} {fmt(s)}" for c, s in slopes[stat].items())
            + " (1 = linear, 2 = quadratic)"
        )
    parts.append("")
    rows = []
    first = args.decode_prefixes[0]
    for P in args.decode_prefixes:
        r = decode[P]
        rows.append(
            [P]
            + [fmt(r[c]["min_s"] * 1e6, 0) for c in r]
            + [fmt(r[c]["min_s"] / decode[first][c]["min_s"]) for c in r]
        )
    names = list(decode[first])
    heads = ["prefix P"] + [f"{c} us" for c in names] + [f"{c} / (P={first})" for c in names]
    parts += [
        "Decoding one token after a prefix of P tokens (min over the repeats):",
        "",
        markdown_table(heads, rows),
    ]
    return "\n".join(parts), slopes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, NAME)
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument("--decode-prefixes", type=int, nargs="+", default=None)
    args = parser.parse_args()
    args.lengths = sorted(args.lengths or (QUICK_LENGTHS if args.quick else LENGTHS))
    args.decode_prefixes = sorted(
        args.decode_prefixes or (QUICK_PREFIXES if args.quick else PREFIXES)
    )
    finish_args(args, NAME, repeats=5, warmup=1)
    torch.set_grad_enabled(False)
    info = machine_info()
    results = {}
    for L in args.lengths:
        log(f"timing L={L}")
        results[L] = time_round_robin(cases(inputs(L)), warmup=args.warmup, repeats=args.repeats)
    decode = {}
    for P in args.decode_prefixes:
        log(f"decoding after P={P}")
        decode[P] = time_round_robin(
            decode_cases(P), warmup=args.warmup + 2, repeats=max(5, 4 * args.repeats)
        )
    info["loadavg_end"] = list(os.getloadavg())
    text, slopes = report(args, info, results, decode)
    print(text)
    write_json(
        args.json,
        {
            "benchmark": NAME,
            "machine": info,
            "settings": {"B": B, "H": H, "D": D, "lengths": args.lengths},
            "warmup": args.warmup,
            "repeats": args.repeats,
            "results": {str(L): results[L] for L in args.lengths},
            "slopes": slopes,
            "decode": {str(P): decode[P] for P in args.decode_prefixes},
            "markdown": text,
        },
    )


if __name__ == "__main__":
    main()
