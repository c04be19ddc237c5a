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
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
MEMORY_TAG = "MEMORY_JSON "
MB = 1e6  # tables use decimal megabytes: (1, 8, 4096, 4096) fp32 = 536.9 MB


# ------------------------------------------------------------------------------ machine
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return "unknown"


def machine_info() -> dict:
    """What the numbers depend on: CPU, cores, threads, torch, allocator, load."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "libc": " ".join(platform.libc_ver()),
        "transparent_hugepage": _read("/sys/kernel/mm/transparent_hugepage/enabled"),
        "malloc_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_")},
        "loadavg_start": list(os.getloadavg()),
        "git": _git_commit(),
    }


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
def _minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_once(fn: Callable[[], object]) -> tuple[float, int]:
    """Seconds and minor page faults of one call (its result is dropped before returning)."""
    f0 = _minflt()
    t0 = time.perf_counter()
    out = fn()
    t1 = time.perf_counter()
    f1 = _minflt()
    del out
    return t1 - t0, f1 - f0


def time_round_robin(
    fns: dict[str, Callable[[], object]], *, warmup: int, repeats: int
) -> dict[str, dict]:
    """Time every case ``repeats`` times, in turn, after ``warmup`` untimed rounds.

    Returns per case: ``median_s``, ``min_s``, ``max_s``, ``samples_s``, ``faults`` (median
    minor page faults per call).
    """
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            time_once(fns[n])
    samples: dict[str, list[tuple[float, int]]] = {n: [] for n in names}
    for r in range(repeats):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            samples[n].append(time_once(fns[n]))
    out = {}
    for n, s in samples.items():
        secs = [t for t, _ in s]
        out[n] = {
            "median_s": statistics.median(secs),
            "min_s": min(secs),
            "max_s": max(secs),
            "samples_s": secs,
            "faults": statistics.median([f for _, f in s]),
        }
    return out


# ------------------------------------------------------------------------------ memory
def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_kb(reset_ok: bool) -> int:
    if reset_ok:
        return _status_kb("VmHWM")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _malloc_trim() -> bool:
    """Return free heap memory to the OS (glibc), so the baseline holds live data only."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


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
