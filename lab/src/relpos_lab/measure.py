"""Measurement primitives shared by ``relpos bench`` and the scripts in ``benchmarks/``
(which import them through ``benchmarks/_common.py``).

* ``machine_info``: what the numbers depend on (CPU, cores, threads, torch, allocator, load,
  git commit), stated with every result.
* ``time_once`` / ``time_round_robin``: warm-up, then the cases of one size timed in turn,
  the order rotating every repeat, so a load spike from another process hits every case
  rather than one; medians and mins of the repeats, every sample kept.
* ``measure_peak``: the extra peak resident memory of one call (Linux): free heap pages are
  returned to the OS (glibc ``malloc_trim(0)``), ``VmRSS`` is read as the baseline, the peak is
  reset (``/proc/self/clear_refs`` = 5) and ``VmHWM`` read after the call. Without a
  writable ``clear_refs`` it falls back to ``ru_maxrss`` and says so (``method``).
"""

from __future__ import annotations

import gc
import os
import platform
import resource
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = [
    "MB",
    "cpu_model",
    "machine_info",
    "machine_line",
    "measure_peak",
    "time_once",
    "time_round_robin",
]

MB = 1e6  # decimal megabytes: (1, 8, 4096, 4096) fp32 = 536.9 MB
REPO = Path(__file__).resolve().parents[3]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit(repo: Path = REPO) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "describe", "--always", "--dirty"],
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
    """What the numbers depend on: CPU, cores, threads, torch, allocator, load, GPU."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable,
        "gpu": gpu,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "libc": " ".join(platform.libc_ver()),
        "transparent_hugepage": _read("/sys/kernel/mm/transparent_hugepage/enabled"),
        "malloc_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_")},
        "loadavg_start": list(os.getloadavg()),
        "git": git_commit(),
    }


def machine_line(info: dict) -> str:
    """One line stating the machine of ``machine_info``."""
    gpu = f"; GPU {info['gpu']}" if info.get("gpu") else "; no GPU"
    load = " ".join(f"{x:.2f}" for x in info.get("loadavg_start", []))
    return (
        f"{info['cpu']}; {info['logical_cpus']} logical CPUs ({info['usable_cpus']} usable), "
        f"torch {info['torch']} with {info['torch_threads']} threads{gpu}; load average "
        f"{load} at the start (a busy machine makes timings noisy: read the ratios)"
    )


# ------------------------------------------------------------------------------ timing
def _minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


#: what ``time_once`` reads: ``"wall"`` (``time.perf_counter``) or ``"cpu"``
#: (``time.process_time``: the CPU time of this process, so the time a loaded machine keeps it
#: waiting for a core is not counted; with one torch thread it is the call's compute time)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def time_once(fn: Callable[[], object], clock: str = "wall") -> tuple[float, int]:
    """Seconds (``clock``) and minor page faults of one call (its result is dropped before
    returning; CUDA work is synchronised)."""
    now = CLOCKS[clock]
    f0 = _minflt()
    _sync()
    t0 = now()
    out = fn()
    _sync()
    t1 = now()
    f1 = _minflt()
    del out
    return t1 - t0, f1 - f0


def time_round_robin(
    fns: dict[str, Callable[[], object]], *, warmup: int, repeats: int, clock: str = "wall"
) -> dict[str, dict]:
    """Time every case ``repeats`` times, in turn, after ``warmup`` untimed rounds
    (``clock``: see ``CLOCKS``).

    Returns per case: ``median_s``, ``min_s``, ``max_s``, ``samples_s``, ``faults`` (median
    minor page faults per call).
    """
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {tuple(CLOCKS)}, got {clock!r}")
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            time_once(fns[n], clock)
    samples: dict[str, list[tuple[float, int]]] = {n: [] for n in names}
    for r in range(repeats):
        k = r % len(names) if names else 0
        for n in names[k:] + names[:k]:
            samples[n].append(time_once(fns[n], clock))
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
def status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_kb(reset_ok: bool) -> int:
    if reset_ok:
        return status_kb("VmHWM")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def malloc_trim() -> bool:
    """Return free heap memory to the OS (glibc), so the baseline holds live data only."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


def measure_peak(run: Callable[[], object], *, collect: bool = True) -> dict:
    """Extra peak memory of one call of ``run``: ``extra_mb`` (resident memory on CPU, or
    ``torch.cuda.max_memory_allocated`` growth when CUDA is in use), ``method``,
    ``baseline_kb``, ``peak_kb``. ``collect=False`` skips the ``gc.collect()`` before the
    baseline (a caller measuring many cases collects once)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = run()
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base
        del out
        return {"method": "torch.cuda.max_memory_allocated", "extra_mb": extra / MB}
    if collect:
        gc.collect()
    trimmed = malloc_trim()
    base = status_kb("VmRSS")
    ok = reset_peak()
    out = run()
    peak = peak_kb(ok)
    del out
    return {
        "method": "VmHWM after clear_refs" if ok else "ru_maxrss (no clear_refs)",
        "malloc_trim": trimmed,
        "baseline_kb": base,
        "peak_kb": peak,
        "extra_mb": max(peak - base, 0) * 1024 / MB,
    }
