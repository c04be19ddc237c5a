"""RoPE on q and k: relpos (eager, fused, the rope encoding) vs HF-style eager vs a plain copy.

fp32, B=1, H=32, L=4096 (--length), D=128, half-split layout (GPT-NeoX / HF Llama).

Cases, timed in turn in one process:

* ``copy``: ``qb.copy_(q); kb.copy_(k)`` into preallocated buffers: the memory-bandwidth
  limit (ratio base 1.0).
* ``hf-eager``: Hugging Face Llama's formula, ``q * cos + rotate_half(q) * sin`` (and k),
  ``rotate_half`` imported from ``transformers.models.llama.modeling_llama`` (or the same
  ``cat(-x2, x1)`` written here when transformers is missing), precomputed (1, 1, L, D)
  cos/sin tables.
* ``relpos-eager``: ``relpos.functional.apply_rotary`` with (1, 1, L, D/2) tables.
* ``relpos-fused``: ``relpos.functional.apply_rotary_fused`` (``torch.compile``); the first
  call, which compiles, is reported separately.
* ``relpos-rope-encoding``: ``enc.rotate(q, pos, "q")``, ``enc.rotate(k, pos, "k")`` with
  ``relpos.create("rope", num_heads=32, head_dim=128)``: includes cos/sin from positions, and
  takes the fused path for tensors of ``relpos.config.FUSED_ROTARY_MIN_NUMEL`` elements or more.

Targets (from the issue): relpos at least 4x faster than hf-eager and within 1.2x of copy.

Allocator. Every case but ``copy`` allocates fresh outputs (64 MiB each at full size), and
glibc's default malloc serves allocations above its mmap threshold (dynamic, at most 32 MiB
on 64-bit) with a fresh ``mmap``: every call then page-faults its output in, which can cost
more than the arithmetic. So the whole table runs twice, each in a child process with its own
environment: ``default`` (no ``MALLOC_*`` variables) and ``tuned``
(``MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296
MALLOC_TOP_PAD_=1073741824``). A probe child checks, with glibc's ``mallinfo2``, whether
allocations of 32 MiB, 64 MiB and one q tensor still come from ``mmap`` under each setting;
if the tuned one still uses ``mmap`` (a glibc that caps the threshold), a third table runs
with ``MALLOC_MMAP_MAX_=0`` added. The page faults per call are in the tables as the second
piece of evidence.

Usage: .venv/bin/python benchmarks/bench_rope.py [--quick] [--length 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
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
    met,
    time_round_robin,
    write_json,
)

import relpos
from relpos import config
from relpos.functional import apply_rotary, apply_rotary_fused, rope_frequencies

NAME = "rope"
B, H, D = 1, 32, 128
LENGTH = 4096
QUICK_LENGTH = 2048  # 32 MiB tensors: the smallest above glibc's mmap-threshold cap
BASELINE = "copy"
CASES = [BASELINE, "hf-eager", "relpos-eager", "relpos-fused", "relpos-rope-encoding"]
TARGET_CASES = ["relpos-fused", "relpos-rope-encoding"]
TARGET_SPEEDUP = 4.0  # vs hf-eager
TARGET_COPY_RATIO = 1.2
TUNED_ENV = {
    "MALLOC_MMAP_THRESHOLD_": "4294967296",
    "MALLOC_TRIM_THRESHOLD_": "4294967296",
    "MALLOC_TOP_PAD_": "1073741824",
}
NO_MMAP_ENV = {**TUNED_ENV, "MALLOC_MMAP_MAX_": "0"}


# ------------------------------------------------------------------------------ allocator
def probe_allocator(sizes: list[int]) -> dict:
    """For each size in bytes: does glibc's malloc serve it from mmap? (``mallinfo2``)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        fields = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"

        class MallInfo2(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in fields.split()]

        libc.mallinfo2.restype = MallInfo2
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
    except (OSError, AttributeError) as err:
        return {"error": f"glibc mallinfo2 unavailable: {err}"}
    out = {}
    for size in sizes:
        before = libc.mallinfo2().hblkhd
        ptr = libc.malloc(size)
        after = libc.mallinfo2().hblkhd
        libc.free(ptr)
        out[str(size)] = "mmap" if after - before >= size else "heap"
    return out


def probe_sizes(L: int) -> list[int]:
    return sorted({32 << 20, 64 << 20, B * H * L * D * 4})


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    """os.environ without MALLOC_* / GLIBC_TUNABLES, plus ``extra``."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"
    }
    env.update(extra)
    return env


def run_probe(L: int, env: dict[str, str]) -> dict:
    cmd = [sys.executable, __file__, "--probe-allocator", "--length", str(L)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"probe failed: {proc.stderr.strip()[-300:]}"}


def uses_mmap(probe: dict) -> bool | None:
    if "error" in probe:
        return None
    return any(v == "mmap" for v in probe.values())


# ------------------------------------------------------------------------------ cases
def make_inputs(L: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, H, L, D, generator=g), torch.randn(B, H, L, D, generator=g)


def _rotate_half():
    try:
        from transformers.models.llama.modeling_llama import rotate_half

        return rotate_half, "transformers.models.llama.modeling_llama.rotate_half"
    except ImportError:

        def rotate_half(x: torch.Tensor) -> torch.Tensor:
            x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
            return torch.cat((-x2, x1), dim=-1)

        return rotate_half, "local cat(-x2, x1) (transformers not installed)"


def build_case(case: str, q: torch.Tensor, k: torch.Tensor) -> tuple[Callable[[], object], dict]:
    L = q.shape[2]
    inv_freq, _ = rope_frequencies(D)
    freqs = torch.arange(L, dtype=torch.float32)[:, None] * inv_freq  # (L, D/2)
    if case == BASELINE:
        qb, kb = torch.empty_like(q), torch.empty_like(k)
        for t in (qb, kb):
            t.zero_()  # fault the buffers in once, outside the timing

        def copy():
            qb.copy_(q)
            kb.copy_(k)
            return qb, kb

        return copy, {}
    if case == "hf-eager":
        rotate_half, source = _rotate_half()
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]  # (1, 1, L, D)

        def hf():
            return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

        return hf, {"rotate_half": source}
    cos, sin = freqs.cos()[None, None], freqs.sin()[None, None]  # (1, 1, L, D/2)
    if case == "relpos-eager":
        return lambda: (apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)), {}
    if case == "relpos-fused":
        return lambda: (apply_rotary_fused(q, cos, sin), apply_rotary_fused(k, cos, sin)), {}
    if case == "relpos-rope-encoding":
        enc = relpos.create("rope", num_heads=H, head_dim=D)
        pos = torch.arange(L)[None]
        fused = config.FUSED_ROTARY is True or (
            config.FUSED_ROTARY == "auto" and q.numel() >= config.FUSED_ROTARY_MIN_NUMEL
        )
        note = {"path": "fused" if fused else "eager"}
        return lambda: (enc.rotate(q, pos, "q"), enc.rotate(k, pos, "k")), note
    raise ValueError(f"unknown case {case!r}; cases: {CASES}")


def fused_fell_back() -> bool:
    import relpos.functional as functional

    return bool(getattr(functional, "_FUSED_BROKEN", False))


# ------------------------------------------------------------------------------ one table
def run_table(args) -> dict:
    """Times every case in this process (this process's allocator environment)."""
    L = args.length
    q, k = make_inputs(L)
    fns, notes, first = {}, {}, {}
    for case in CASES:
        fn, note = build_case(case, q, k)
        t0 = time.perf_counter()
        out = fn()
        first[case] = time.perf_counter() - t0  # relpos-fused: includes compilation
        if case not in (BASELINE, "hf-eager"):
            ref = fns["hf-eager"]()
            errs = [float((a - b).abs().max()) for a, b in zip(out, ref, strict=True)]
            note["max_abs_err_vs_hf"] = max(errs)
        del out
        fns[case], notes[case] = fn, note
        log(f"  {args.allocator}: {case} first call {first[case] * 1e3:.1f} ms {note}")
    if fused_fell_back():
        notes["relpos-fused"]["warning"] = "compile failed: fell back to eager"
    timing = time_round_robin(fns, warmup=args.warmup, repeats=args.repeats)
    mem = {}
    if not args.no_memory:
        for case in CASES:
            mem[case] = measure_memory(__file__, case, [*child_args(), "--length", str(L)])
            log(f"  {args.allocator}: memory {case}: {mem[case]}")
    return {
        "allocator": args.allocator,
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        "probe": probe_allocator(probe_sizes(L)),
        "machine": machine_info(),
        "cases": {
            c: {**timing[c], "first_call_s": first[c], **notes[c], "memory": mem.get(c)}
            for c in CASES
        },
    }


def table_markdown(t: dict, L: int) -> str:
    cases = t["cases"]
    base = cases[BASELINE]["median_s"]
    hf = cases["hf-eager"]["median_s"]
    moved = 4 * B * H * L * D * 4 / 1e9  # read q, k and write two outputs, GB
    rows = []
    for c in CASES:
        r = cases[c]
        m = r.get("memory") or {}
        notes = []
        if c == "relpos-fused":
            notes.append(f"first call {r['first_call_s']:.2f} s (compiles)")
        if "path" in r:
            notes.append(f"{r['path']} path")
        if r.get("max_abs_err_vs_hf") is not None:
            notes.append(f"max abs err vs hf {r['max_abs_err_vs_hf']:.1e}")
        if "warning" in r:
            notes.append(r["warning"])
        rows.append(
            [
                c,
                fmt(r["median_s"] * 1e3, 2),
                fmt(r["median_s"] / base, 2),
                fmt(hf / r["median_s"], 2),
                fmt(moved / r["median_s"], 1),
                f"{r['faults']:.0f}",
                fmt(m.get("extra_mb"), 1) if m else "not measured",
                fmt(m.get("first_call_extra_mb"), 1) if m else "",
                "; ".join(notes),
            ]
        )
    return markdown_table(
        [
            "case",
            "ms",
            "ratio vs copy",
            "speed-up vs hf-eager",
            "GB/s",
            "page faults/call",
            "extra peak MB",
            "first-call extra MB",
            "notes",
        ],
        rows,
    )


def report(args, info: dict, probes: dict, tables: dict) -> str:
    L = args.length
    settings = {
        "B": B,
        "H": H,
        "L": L,
        "D": D,
        "dtype": "float32",
        "layout": "half",
        "warmup": args.warmup,
        "repeats": args.repeats,
        "FUSED_ROTARY": config.FUSED_ROTARY,
        "FUSED_ROTARY_MIN_NUMEL": config.FUSED_ROTARY_MIN_NUMEL,
    }
    out = [header("relpos RoPE: rotation of q and k vs copy and HF eager", info, settings)]
    out.append(
        "\nms = median of the repeats for q and k together (cases timed in turn); ratio vs "
        "copy = ms / ms of copy; speed-up vs hf-eager = ms of hf-eager / ms; GB/s = 4 tensors "
        f"of {B * H * L * D * 4 / MB:.1f} MB (read q, k; write two outputs) / time; page "
        "faults = median minor faults per call; extra peak MB = steady-state extra peak "
        "resident memory of one call in a fresh child (first-call extra includes compilation)."
    )
    out.append("\n### Allocator probe (where glibc malloc puts allocations of these sizes)\n")
    sizes = probe_sizes(L)
    prow = []
    for name, (env, probe) in probes.items():
        envs = " ".join(f"{k}={v}" for k, v in env.items()) or "(none)"
        cells = [probe.get(str(s), probe.get("error", "?")) for s in sizes]
        prow.append([name, f"`{envs}`", *cells])
    out.append(markdown_table(["table", "env", *[f"{s / 2**20:.0f} MiB" for s in sizes]], prow))
    for name, t in tables.items():
        out.append(f"\n### Allocator: {name}\n")
        if "error" in t:
            out.append(f"table failed: {t['error']}")
            continue
        out.append(table_markdown(t, L))
    good = {n: t for n, t in tables.items() if "error" not in t}
    if "default" in good and len(good) > 1:
        out.append("\n### Allocator effect (ms, default / other)\n")
        names = [n for n in good if n != "default"]
        rows = []
        for c in CASES:
            d = good["default"]["cases"][c]["median_s"]
            row = [c, fmt(d * 1e3, 2)]
            for n in names:
                o = good[n]["cases"][c]["median_s"]
                row += [fmt(o * 1e3, 2), fmt(d / o, 2)]
            rows.append(row)
        heads = ["case", "default ms"]
        for n in names:
            heads += [f"{n} ms", f"default / {n}"]
        out.append(markdown_table(heads, rows))
    out.append(
        f"\n### Targets: speed-up vs hf-eager >= {TARGET_SPEEDUP:g}, ratio vs copy <= "
        f"{TARGET_COPY_RATIO:g}\n"
    )
    trows = []
    for name, t in good.items():
        base = t["cases"][BASELINE]["median_s"]
        hf = t["cases"]["hf-eager"]["median_s"]
        for c in TARGET_CASES:
            s = t["cases"][c]["median_s"]
            trows.append(
                [
                    name,
                    c,
                    fmt(hf / s, 2),
                    met(hf / s >= TARGET_SPEEDUP),
                    fmt(s / base, 2),
                    met(s / base <= TARGET_COPY_RATIO),
                ]
            )
    out.append(
        markdown_table(
            ["allocator", "case", "speed-up vs hf", "speed-up", "ratio vs copy", "copy"], trows
        )
    )
    return "\n".join(out)


def run_child_table(name: str, env: dict[str, str], args) -> dict:
    """Re-exec this script with ``env`` to time the table under that allocator setting."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "table.json"
        cmd = [
            sys.executable,
            __file__,
            "--allocator",
            name,
            "--child-json",
            str(path),
            "--length",
            str(args.length),
            "--repeats",
            str(args.repeats),
            "--warmup",
            str(args.warmup),
            *child_args(),
            *(["--no-memory"] if args.no_memory else []),
        ]
        log(f"table {name}: {' '.join(f'{k}={v}' for k, v in env.items() if 'MALLOC' in k)}")
        proc = subprocess.run(cmd, env=env, timeout=3600)
        if proc.returncode or not path.exists():
            return {"error": f"child exited {proc.returncode}"}
        return json.loads(path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, NAME)
    parser.add_argument("--length", type=int, default=None)
    parser.add_argument("--allocator", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-json", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--probe-allocator", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.length is None:
        args.length = QUICK_LENGTH if args.quick else LENGTH
    finish_args(args, NAME, repeats=15, warmup=3)
    if args.probe_allocator:
        print(json.dumps(probe_allocator(probe_sizes(args.length))))
        return
    if args.measure_memory:
        q, k = make_inputs(args.length)
        fn, _ = build_case(args.case, q, k)
        memory_child(fn)
        return
    torch.set_grad_enabled(False)
    if args.allocator is not None:  # a table child
        result = run_table(args)
        args.child_json.write_text(json.dumps(result, default=str))
        return
    info = machine_info()
    variants = {"default": {}, "tuned": TUNED_ENV}
    probes = {n: (e, run_probe(args.length, clean_env(e))) for n, e in variants.items()}
    if uses_mmap(probes["tuned"][1]):
        probes["tuned+MALLOC_MMAP_MAX_=0"] = (
            NO_MMAP_ENV,
            run_probe(args.length, clean_env(NO_MMAP_ENV)),
        )
        variants["tuned+MALLOC_MMAP_MAX_=0"] = NO_MMAP_ENV
    log(f"allocator probes: {probes}")
    tables = {n: run_child_table(n, clean_env(e), args) for n, e in variants.items()}
    info["loadavg_end"] = list(os.getloadavg())
    text = report(args, info, probes, tables)
    print(text)
    write_json(
        args.json,
        {
            "benchmark": NAME,
            "machine": info,
            "settings": {"B": B, "H": H, "L": args.length, "D": D},
            "warmup": args.warmup,
            "repeats": args.repeats,
            "probes": {n: {"env": e, "result": p} for n, (e, p) in probes.items()},
            "tables": tables,
            "markdown": text,
        },
    )


if __name__ == "__main__":
    main()
