"""Forward speed and memory of biased causal attention: relpos vs SDPA without a bias.

Inference (no grad), fp32, B=1, H=8, D=64, causal, L in --lengths (1024 2048 4096).

Cases, all in one run, timed round robin:

* ``sdpa-nobias``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``, the speed
  limit (ratio 1.0): the same attention without any bias.
* ``dense-mask-materialize``: building the (1, H, L, L) float ALiBi bias with ``-inf`` above
  the diagonal, alone (it is part of the next case).
* ``sdpa-dense-mask``: the usual practice: materialise that bias, pass it as ``attn_mask``.
* ``relpos-alibi``, ``relpos-kerple-log``, ``relpos-fire``, ``relpos-t5``:
  ``relpos.attention(q, k, v, enc, causal=True)`` (backend "auto"; the notes say which
  backend auto chose and, for ``chunked``, whether the Toeplitz or the tile path ran).
* ``flex-alibi-compiled``: a peer straight from torch: ``torch.compile(flex_attention)`` with
  an ALiBi ``score_mod`` and a causal block mask (block mask built once, outside the timing).

Targets (from the issue), at L=4096: relpos with ALiBi, KERPLE, FIRE and T5 at most 1.5x
``sdpa-nobias``, with O(L) extra memory: no L x L tensor, read here as an extra peak below
10 % of one dense (1, H, L, L) fp32 bias (53.7 MB of 537 MB at L=4096); the growth exponent
between the two largest lengths (1 for O(L), 2 for O(L^2)) is printed beside it.

Up to L=2048 every output is also checked against relpos's eager backend (max abs error in
the notes). FIRE takes the Toeplitz path only while every query position lies below its
learned threshold (512 at init); beyond it the tile path runs.

Usage: .venv/bin/python benchmarks/bench_bias_forward.py [--quick] [--lengths 1024 2048 4096]
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
    met,
    time_once,
    time_round_robin,
    write_json,
)

import relpos
from relpos.attention import plan
from relpos.attention.api import DENSE_BIAS_LIMIT
from relpos.functional import alibi_slopes

NAME = "bias_forward"
B, H, D = 1, 8, 64
LENGTHS = [1024, 2048, 4096]
QUICK_LENGTHS = [512, 1024]
TARGET_L = 4096
TARGET_RATIO = 1.5
MEMORY_FRACTION = 0.10  # "no L x L tensor": extra peak below 10 % of one dense fp32 bias
BASELINE = "sdpa-nobias"
CHECK_MAX_L = 2048  # outputs are checked against the eager backend up to this length
RELPOS = {
    "relpos-alibi": "alibi",
    "relpos-kerple-log": "kerple-log",
    "relpos-fire": "fire",
    "relpos-t5": "t5",
}
CASES = [
    BASELINE,
    "dense-mask-materialize",
    "sdpa-dense-mask",
    *RELPOS,
    "flex-alibi-compiled",
]


def make_inputs(L: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g) for _ in range(3))
    return q, k, v


def dense_alibi_bias(L: int) -> torch.Tensor:
    """(1, H, L, L) float: ``-m_h (i - j)`` for ``j <= i``, ``-inf`` above the diagonal."""
    slopes = alibi_slopes(H)
    i = torch.arange(L)
    d = i[:, None] - i[None, :]
    bias = -slopes[:, None, None] * d
    return bias.masked_fill_(d < 0, float("-inf"))[None]


def dense_bias_mb(L: int) -> float:
    return B * H * L * L * 4 / MB


_FLEX = None


def compiled_flex():
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX = torch.compile(flex_attention, dynamic=False)
    return _FLEX


def make_encoding(name: str):
    torch.manual_seed(0)
    return relpos.create(name, num_heads=H, head_dim=D)


def auto_choice(q, k, v, enc) -> str:
    """The backend ``auto`` picks for this call (and the chunked path it takes)."""
    name, path = plan(q, k, v, enc, causal=True)
    if name == "chunked":
        name += f"/{path}"
    elif path == "dense-bias":
        name += " (dense bias)"
    return name


def build_case(case: str, q, k, v) -> tuple[Callable[[], object], dict]:
    """A zero-argument callable for the case, and notes about it."""
    L = q.shape[2]
    if case == BASELINE:
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), {}
    if case == "dense-mask-materialize":
        return lambda: dense_alibi_bias(L), {"note": "part of sdpa-dense-mask"}
    if case == "sdpa-dense-mask":
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense_alibi_bias(L)), {}
    if case in RELPOS:
        enc = make_encoding(RELPOS[case])
        note = {"auto": auto_choice(q, k, v, enc)}
        return lambda: relpos.attention(q, k, v, enc, causal=True), note
    if case == "flex-alibi-compiled":
        from torch.nn.attention.flex_attention import create_block_mask

        slopes = alibi_slopes(H)

        def alibi(score, b, h, q_idx, kv_idx):
            return score - slopes[h] * (q_idx - kv_idx)

        def causal(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx

        t0 = time.perf_counter()
        block_mask = create_block_mask(causal, None, None, L, L, device="cpu")
        mask_s = time.perf_counter() - t0
        flex = compiled_flex()
        return (
            lambda: flex(q, k, v, score_mod=alibi, block_mask=block_mask),
            {"block_mask_s": mask_s},
        )
    raise ValueError(f"unknown case {case!r}; cases: {CASES}")


def reference(case: str, q, k, v) -> torch.Tensor | None:
    """What the case must compute: relpos's eager backend (ALiBi for the dense and flex cases)."""
    if case in RELPOS:
        return relpos.attention(q, k, v, make_encoding(RELPOS[case]), causal=True, backend="eager")
    if case in ("sdpa-dense-mask", "flex-alibi-compiled"):
        return relpos.attention(q, k, v, make_encoding("alibi"), causal=True, backend="eager")
    return None


# ------------------------------------------------------------------------------ runs
def run_length(L: int, args) -> dict:
    q, k, v = make_inputs(L)
    fns, notes, first = {}, {}, {}
    for case in CASES:
        fn, note = build_case(case, q, k, v)
        first[case] = time_once(fn)[0]  # includes compilation for the flex case
        fns[case], notes[case] = fn, note
        log(f"  L={L} {case}: first call {first[case] * 1e3:.1f} ms {note}")
    errors = {}
    if L <= CHECK_MAX_L:
        for case in CASES:
            ref = reference(case, q, k, v)
            if ref is not None:
                errors[case] = float((fns[case]() - ref).abs().max())
    timing = time_round_robin(fns, warmup=args.warmup, repeats=args.repeats)
    out = {}
    for case in CASES:
        t = timing[case]
        out[case] = {
            **t,
            "first_call_s": first[case],
            **notes[case],
            "max_abs_err_vs_eager": errors.get(case),
        }
    return out


def notes_for(case: str, r: dict, mats: dict | None) -> str:
    parts = []
    if "auto" in r:
        parts.append(f"auto: {r['auto']}")
    if case == "sdpa-dense-mask" and mats is not None:
        parts.append(f"of which materialize {mats['median_s'] * 1e3:.1f} ms")
    if case == "flex-alibi-compiled":
        compile_s = r["first_call_s"] - r["median_s"]
        parts.append(f"compile (first call - median) {compile_s:.1f} s")
        parts.append(f"block mask {r['block_mask_s'] * 1e3:.1f} ms")
    if "note" in r:
        parts.append(r["note"])
    if r.get("max_abs_err_vs_eager") is not None:
        parts.append(f"max abs err vs eager {r['max_abs_err_vs_eager']:.1e}")
    return "; ".join(parts)


def growth_exponent(mem: dict, results: dict, case: str, lengths: list[int]) -> float | None:
    """log(extra(L2) / extra(L1)) / log(L2 / L1) for the two largest lengths; None when the
    extras are too small to compare or auto switched backends between them."""
    if len(lengths) < 2:
        return None
    l1, l2 = lengths[-2], lengths[-1]
    if results[l1][case].get("auto") != results[l2][case].get("auto"):
        return None
    m1 = mem.get((case, l1), {}).get("extra_mb")
    m2 = mem.get((case, l2), {}).get("extra_mb")
    if m1 is None or m2 is None or m1 < 1.0 or m2 <= 0:
        return None
    return math.log(m2 / m1) / math.log(l2 / l1)


def report(args, info: dict, results: dict, mem: dict) -> str:
    lengths = args.lengths
    settings = {
        "B": B,
        "H": H,
        "D": D,
        "dtype": "float32",
        "causal": True,
        "grad": "off",
        "lengths": lengths,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "DENSE_BIAS_LIMIT": DENSE_BIAS_LIMIT,
    }
    out = [header("relpos bias forward: relpos.attention vs SDPA without a bias", info, settings)]
    out.append(
        "\nms = median of the repeats (cases timed in turn); ratio = ms / ms of "
        f"{BASELINE} at the same L; extra peak MB = steady-state extra peak resident memory "
        "of one call in a fresh child process (1 MB = 10^6 bytes)."
    )
    rows = []
    for L in lengths:
        base = results[L][BASELINE]["median_s"]
        for case in CASES:
            r = results[L][case]
            m = mem.get((case, L), {})
            extra = m.get("extra_mb")
            rows.append(
                [
                    case,
                    L,
                    fmt(r["median_s"] * 1e3, 1),
                    fmt(r["median_s"] / base, 2),
                    fmt(extra, 1) if extra is not None else m.get("error", "not measured"),
                    notes_for(case, r, results[L].get("dense-mask-materialize")),
                ]
            )
    out.append("")
    out.append(
        markdown_table(["case", "L", "ms", f"ratio vs {BASELINE}", "extra peak MB", "notes"], rows)
    )

    target_l = TARGET_L if TARGET_L in lengths else max(lengths)
    limit_mb = MEMORY_FRACTION * dense_bias_mb(target_l)
    out.append(
        f"\n### Targets at L={target_l}"
        + ("" if target_l == TARGET_L else f" (the issue asks L={TARGET_L}; not in this run)")
    )
    out.append(
        f"\nspeed: ratio vs {BASELINE} <= {TARGET_RATIO}; memory: extra peak <= "
        f"{MEMORY_FRACTION:.0%} of a dense (1, {H}, L, L) fp32 bias = {limit_mb:.1f} MB "
        f"(the bias itself: {dense_bias_mb(target_l):.1f} MB); growth exponent of the extra "
        f"memory between L={lengths[-2] if len(lengths) > 1 else '-'} and L={lengths[-1]}: "
        "~1 for O(L), ~2 for O(L^2) (n/a when auto chose different backends or the "
        "extras are below 1 MB)."
    )
    trows = []
    base = results[target_l][BASELINE]["median_s"]
    for case in RELPOS:
        r = results[target_l][case]
        ratio = r["median_s"] / base
        extra = mem.get((case, target_l), {}).get("extra_mb")
        expo = growth_exponent(mem, results, case, lengths)
        trows.append(
            [
                case,
                r.get("auto", ""),
                fmt(ratio, 2),
                met(ratio <= TARGET_RATIO),
                fmt(extra, 1),
                met(None if extra is None else extra <= limit_mb),
                fmt(expo, 2),
            ]
        )
    out.append("")
    out.append(
        markdown_table(
            ["case", "auto chose", "ratio", "speed", "extra MB", "memory", "growth exponent"],
            trows,
        )
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
    args = parser.parse_args()
    if args.lengths is None:
        args.lengths = QUICK_LENGTHS if args.quick else LENGTHS
    args.lengths = sorted(args.lengths)
    finish_args(args, NAME, repeats=7, warmup=2)
    if args.measure_memory:
        memory_child_main(args)
        return
    torch.set_grad_enabled(False)
    info = machine_info()
    mem: dict = {}
    if not args.no_memory:
        for L in args.lengths:
            for case in CASES:
                m = measure_memory(__file__, case, [*child_args(), "--lengths", str(L)])
                mem[(case, L)] = m
                log(f"memory L={L} {case}: {m}")
    results = {}
    for L in args.lengths:
        log(f"timing L={L}")
        results[L] = run_length(L, args)
    info["loadavg_end"] = list(os.getloadavg())
    text = report(args, info, results, mem)
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
            "memory": {f"{c}@{L}": m for (c, L), m in mem.items()},
            "markdown": text,
        },
    )


if __name__ == "__main__":
    main()
