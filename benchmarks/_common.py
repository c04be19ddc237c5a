"""Shared harness of the relpos benchmarks (not a benchmark itself).

* ``machine_info`` / ``header``: the command, the machine and the settings, printed first.
* ``time_round_robin``: warm-up, then the cases of one size timed in turn (round robin, the
  order rotating every repeat), so a load spike from another process hits every case rather
  than one; medians and mins of the repeats, every sample kept for the JSON.
* ``measure_memory``: extra peak memory of one case in a fresh child process (the same
  script re-run with ``--case NAME --measure-memory``); ``memory_child`` is its child side.
* ``markdown_table``, ``write_json``.

Memory method (child side; Linux reports resident memory in kB = KiB). The child allocates
the inputs, returns free heap pages to the OS (glibc ``malloc_trim(0)``: pages the allocator
kept from earlier frees would otherwise sit in the baseline and be reused by the measured
call, hiding part of its working memory), reads ``VmRSS`` from ``/proc/self/status`` (the
baseline), resets the peak by writing "5" to ``/proc/self/clear_refs``, runs the case once
and reads the peak ``VmHWM``: extra = peak - baseline. That first call is reported as
``first_call_extra_mb`` (it includes one-time work: compilation, thread pools). Then it drops
the output, trims, takes a new baseline, resets the peak and runs the case again:
``extra_mb``, the steady state, is what the tables show.

``ru_maxrss`` (``getrusage``) is recorded but not used: Linux carries the parent's peak into a
child across the spawn (fork or vfork, then exec; ``signal->maxrss``), so a child started by
a benchmark that has just run a 2 GB case reports at least 2 GB whatever it does, and it
cannot be reset between the two calls. Without a writable ``clear_refs`` the child falls
back to ``ru_maxrss`` and says so (``method``).
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # the repo's relpos

from relpos_lab import measure  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MEMORY_TAG = "MEMORY_JSON "
MB = 1e6  # tables use decimal megabytes: (1, 8, 4096, 4096) fp32 = 536.9 MB


# ------------------------------------------------------------------------------ machine
# the primitives live in the package (``relpos bench`` uses them too)
cpu_model = measure.cpu_model
machine_info = measure.machine_info
_read = measure._read


def command_line() -> str:
    argv = getattr(sys, "orig_argv", [sys.executable, *sys.argv])
    return shlex.join(argv)


def _loads(values: list[float] | None) -> str:
    return "n/a" if not values else " ".join(f"{x:.2f}" for x in values)


def header(title: str, info: dict, settings: dict) -> str:
    """Markdown preamble: command, machine, settings."""
    env = " ".join(f"{k}={v}" for k, v in info["malloc_env"].items()) or "(none)"
    lines = [
        f"## {title}",
        "",
        f"- command: `{command_line()}`",
        f"- machine: {info['cpu']}; {info['logical_cpus']} logical CPUs "
        f"({info['usable_cpus']} usable); torch {info['torch']}, "
        f"torch.get_num_threads() = {info['torch_threads']}; python {info['python']}; "
        f"{info['libc']}; THP {info['transparent_hugepage']}",
        f"- MALLOC_* environment: {env}",
        f"- load average at start: {_loads(info.get('loadavg_start'))}, at end: "
        f"{_loads(info.get('loadavg_end'))} (a busy machine makes the timings noisy); "
        f"git {info['git']}",
        "- settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()),
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ CLI
def add_common_args(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per case")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls per case")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help=f"where to write the results (default runs/bench/{name}.json, "
        f"runs/bench/{name}-quick.json with --quick)",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the memory children")
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--measure-memory", action="store_true", help=argparse.SUPPRESS)


def finish_args(args: argparse.Namespace, name: str, repeats: int, warmup: int) -> None:
    """Fill defaults that depend on --quick; apply --threads."""
    if args.repeats is None:
        args.repeats = 3 if args.quick else repeats
    if args.warmup is None:
        args.warmup = 1 if args.quick else warmup
    if args.json is None:
        args.json = REPO / "runs" / "bench" / f"{name}{'-quick' if args.quick else ''}.json"
    if args.threads is not None:
        torch.set_num_threads(args.threads)


def child_args() -> list[str]:
    """Arguments a memory child needs to rebuild the same inputs."""
    return ["--threads", str(torch.get_num_threads())]


def log(msg: str) -> None:
    """Progress goes to stderr; stdout carries only the markdown report."""
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ timing
time_once = measure.time_once
time_round_robin = measure.time_round_robin

# ------------------------------------------------------------------------------ memory
_status_kb = measure.status_kb
_reset_peak = measure.reset_peak
_peak_kb = measure.peak_kb
_malloc_trim = measure.malloc_trim


def memory_child(run: Callable[[], object], before_baseline: Callable[[], None] | None = None):
    """Child side of ``measure_memory``: inputs are allocated; measure two calls of ``run``.

    ``before_baseline`` (optional) runs after the first call, before the second baseline
    (e.g. dropping gradients so they are not counted in the baseline). Prints one line
    ``MEMORY_JSON {...}`` to stdout and exits.
    """
    gc.collect()
    trimmed = _malloc_trim()
    base0 = _status_kb("VmRSS")
    reset_ok = _reset_peak()
    t0 = time.perf_counter()
    out = run()
    first_s = time.perf_counter() - t0
    peak0 = _peak_kb(reset_ok)
    del out
    if before_baseline is not None:
        before_baseline()
    gc.collect()
    _malloc_trim()
    base1 = _status_kb("VmRSS")
    reset_ok = _reset_peak() and reset_ok
    out = run()
    peak1 = _peak_kb(reset_ok)
    del out
    result = {
        "method": "VmHWM after clear_refs" if reset_ok else "ru_maxrss (no clear_refs)",
        "malloc_trim": trimmed,
        "baseline_kb": base1,
        "peak_kb": peak1,
        "extra_mb": (peak1 - base1) * 1024 / MB,
        "first_call_baseline_kb": base0,
        "first_call_peak_kb": peak0,
        "first_call_extra_mb": (peak0 - base0) * 1024 / MB,
        "first_call_s": first_s,
        "ru_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }
    print(MEMORY_TAG + json.dumps(result), flush=True)


def measure_memory(
    script: str, case: str, args: list[str], env: dict | None = None, timeout: float = 1800
) -> dict:
    """Run ``script --case CASE --measure-memory *args`` in a fresh process; its result."""
    cmd = [sys.executable, script, *args, "--case", case, "--measure-memory"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in proc.stdout.splitlines():
        if line.startswith(MEMORY_TAG):
            return json.loads(line[len(MEMORY_TAG) :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}


# ------------------------------------------------------------------------------ output
def fmt(x: float | None, digits: int = 2) -> str:
    if x is None or x != x:
        return "n/a"
    return f"{x:.{digits}f}"


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: Path, payload: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    log(f"wrote {path}")


def met(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT met")
