"""The README's demo results from a recorded run: ``python -m relpos_lab.readme_results``
(``make readme-results``).

The README shows what ``relpos demo`` (``make demo``: the quick ``relpos extrapolate`` profile
into ``runs/demo``) measured: a perplexity table and the plot ``docs/img/ppl_vs_length.png``.
Neither is written by hand. The run's ``results.json`` is committed as
``docs/runs/demo/results.json`` (rows plus the run's metadata: command, versions, machine, wall
time) with ``docs/runs/demo/recording.json`` (how it was recorded: CPU time and machine load
when this module ran the demo itself), and this module

1. optionally reruns the demo (``--rerun``, in the repository root, into ``runs/demo``) or
   takes a finished demo folder (``--from runs/demo``) and records it;
2. rewrites the README block between ``<!-- demo-results:start -->`` and
   ``<!-- demo-results:end -->`` from the recorded JSON (``render_block``);
3. redraws the README's plot from the recorded JSON with the lab's own plot code
   (``relpos_lab.report.plot_ppl_vs_length``) and stores the SHA-256 of the JSON in the PNG as
   a ``tEXt`` chunk (``RESULTS_HASH_KEY``), so a test can tell which recorded file the picture
   was drawn from without comparing pixels.

Without flags only steps 2 and 3 run (seconds). ``tests/test_readme_results.py`` checks that
the README block is the rendering of the recorded JSON and that the PNG carries its hash.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import shutil
import struct
import sys
import tempfile
import textwrap
import threading
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import report
from .io import atomic_write

__all__ = [
    "README",
    "RESULTS",
    "RECORDING",
    "PLOT",
    "START",
    "END",
    "RESULTS_HASH_KEY",
    "DEMO_COMMAND",
    "results_digest",
    "render_block",
    "replace_block",
    "readme_block",
    "draw_plot",
    "png_text",
    "add_png_text",
    "check_demo_results",
    "record_run",
    "rerun_demo",
    "regenerate",
    "main",
]

#: paths relative to the repository root
README = Path("README.md")
RESULTS = Path("docs/runs/demo/results.json")
RECORDING = Path("docs/runs/demo/recording.json")
PLOT = Path("docs/img/ppl_vs_length.png")
START, END = "<!-- demo-results:start -->", "<!-- demo-results:end -->"
#: the PNG ``tEXt`` keyword holding the SHA-256 (hex) of the results file the plot shows
RESULTS_HASH_KEY = "relpos results sha256"
#: the command the recorded run must come from (what ``make demo`` runs)
DEMO_COMMAND = "relpos demo"
#: the evaluation mode of the README table (the plot shows every mode)
TABLE_MODE = "nonoverlapping"
LOAD_SAMPLE_SECONDS = 30.0
#: the README's line width
WRAP = 92


def results_digest(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of the file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ------------------------------------------------------------------------------ checks


def check_demo_results(data: Any, source: str) -> None:
    """Raise ``ValueError`` unless ``data`` (a parsed ``results.json``) is a finished
    ``relpos demo`` run: ``meta.command`` is ``relpos demo``, the quick profile, and rows."""
    if not isinstance(data, dict) or not isinstance(data.get("meta"), dict):
        raise ValueError(f"{source}: not a relpos extrapolate results.json (no 'meta' object)")
    rows = data.get("rows")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{source}: holds no result rows (an unfinished run?)")
    command = data["meta"].get("command")
    if command != DEMO_COMMAND or data["meta"].get("profile") != "quick":
        raise ValueError(
            f"{source}: the README shows what `{DEMO_COMMAND}` prints, but this run came from "
            f"{command!r} (profile {data['meta'].get('profile')!r}); record a `{DEMO_COMMAND}` "
            "run (make demo) or use --rerun"
        )


def _load(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(
            f"{path}: missing (record a demo run: --rerun or --from runs/demo)"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path}: not readable JSON ({err})") from None


# ------------------------------------------------------------------------------ the README block


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def _timing_sentence(meta: dict[str, Any], recording: dict[str, Any]) -> str:
    """How the run went: wall time, machine load, CPU time, threads, versions."""
    machine, versions = meta.get("machine", {}), meta.get("versions", {})
    cpus = machine.get("cpu_count", "?")
    text = ""
    wall = meta.get("wall_seconds")
    if isinstance(wall, (int, float)):
        text = f"It took {_minutes(wall)} of wall time on {cpus} CPUs"
        load = recording.get("load_average") or {}
        start = machine.get("load_average")
        if isinstance(load.get("mean"), (int, float)):
            shared = isinstance(cpus, int) and load["mean"] > cpus
            text += (
                (" shared with other jobs" if shared else "")
                + f" (1-minute load average {load['mean']:.1f} over the run, "
                f"{load['start']:.1f} at the start"
                + ("; the run often waited for a core)" if shared else ")")
            )
        elif start:
            text += f" (load average {start[0]:.1f} at the start)"
        cpu = recording.get("cpu_seconds")
        if isinstance(cpu, (int, float)):
            text += f", {cpu / 60:.1f} CPU-minutes"
        threads = machine.get("torch_threads")
        if threads:
            text += f" with {threads} torch thread{'' if threads == 1 else 's'}"
        text += "; "
    text += (
        f"relpos {versions.get('relpos', '?')}, torch {versions.get('torch', '?')}, "
        f"python {versions.get('python', '?')}."
    )
    return text[0].upper() + text[1:]


def render_block(results: dict[str, Any], recording: dict[str, Any] | None = None) -> str:
    """The README's demo block (between ``START`` and ``END``, markers excluded): a sentence
    on the run, the plot and the perplexity table of ``TABLE_MODE``, from ``results``
    (a parsed ``results.json``) and ``recording`` (``recording.json``, optional)."""
    recording = recording or {}
    meta, rows = results["meta"], results["rows"]
    first = rows[0]
    train_len = int(first["train_len"])
    grid = report.ppl_grid(rows, TABLE_MODE)
    lengths = sorted({n for values in grid.values() for n in values})
    longest = max(lengths)
    mult = f"{longest / train_len:g}L"
    corpus = meta.get("corpus", {}).get("name", "?")
    about = (
        f"The recorded `{meta['command']}` run ([{RESULTS.as_posix()}]({RESULTS.as_posix()}); "
        "`make readme-results` redraws this block and the plot from it): one model per "
        f"encoding trained at L = {train_len} tokens ({first['steps']} steps, batch "
        f"{first['batch']}, dim {first['dim']}, depth {first['depth']}, {first['heads']} heads, "
        + (f"{first['init']} init, {first['head']} head, " if "init" in first else "")
        + f"seed {first['seed']}), perplexity on the `{first['split']}` split of `{corpus}` "
        "(unseen in training). " + _timing_sentence(meta, recording)
    )
    lines = [
        textwrap.fill(about, WRAP, break_long_words=False, break_on_hyphens=False),
        "",
        f"![perplexity vs evaluation length]({PLOT.as_posix()})",
        "",
        f"Perplexity, {report.MODE_TITLES[TABLE_MODE]}:",
        "",
        "| encoding | " + " | ".join(str(n) for n in lengths) + f" | ppl({mult}) / ppl(L) |",
        "|---|" + "---:|" * (len(lengths) + 1),
    ]
    for name, values in grid.items():
        cells = [f"{values[n]:.2f}" if n in values else "-" for n in lengths]
        base = values.get(train_len, values[min(values)])
        ratio = f"{values[longest] / base:.2f}" if longest in values else "-"
        lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


def readme_block(text: str) -> str:
    """The text between the README's ``START`` and ``END`` markers (stripped); ``ValueError``
    unless there is exactly one such block."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise ValueError(f"README.md: expected one {START} ... {END} block")
    return text.split(START, 1)[1].split(END, 1)[0].strip()


def replace_block(text: str, block: str) -> str:
    """``text`` with its one ``START`` ... ``END`` block replaced by ``block``."""
    readme_block(text)  # exactly one block, or ValueError
    pattern = re.escape(START) + ".*?" + re.escape(END)
    return re.sub(pattern, lambda _: f"{START}\n{block}\n{END}", text, count=1, flags=re.S)


# ------------------------------------------------------------------------------ the plot


def _chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """``[(type, payload)]`` of a PNG file's chunks (``ValueError`` if it is no PNG)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG file")
    chunks, pos = [], 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        chunks.append((kind, data[pos + 8 : pos + 8 + length]))
        pos += 12 + length
    return chunks


def _chunk(kind: bytes, payload: bytes) -> bytes:
    crc = zlib.crc32(kind + payload) & 0xFFFFFFFF
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)


def png_text(path: str | os.PathLike) -> dict[str, str]:
    """The ``tEXt`` chunks of a PNG file as ``{keyword: text}``."""
    out = {}
    for kind, payload in _chunks(Path(path).read_bytes()):
        if kind == b"tEXt":
            key, _, value = payload.partition(b"\0")
            out[key.decode("latin-1")] = value.decode("latin-1")
    return out


def add_png_text(data: bytes, items: dict[str, str]) -> bytes:
    """PNG bytes with ``tEXt`` chunks for ``items`` inserted before ``IEND`` (PNG
    Specification, Second Edition, section 11.3.4.3: Latin-1 keyword of 1-79 characters, a
    NUL, the text)."""
    chunks = _chunks(data)
    if not chunks or chunks[-1][0] != b"IEND":
        raise ValueError("PNG file without a final IEND chunk")
    extra = b"".join(
        _chunk(b"tEXt", key.encode("latin-1") + b"\0" + value.encode("latin-1"))
        for key, value in items.items()
    )
    return data[: len(data) - 12] + extra + data[len(data) - 12 :]


def draw_plot(results_path: str | os.PathLike, png_path: str | os.PathLike) -> None:
    """Draw the perplexity-vs-length plot of ``results_path`` into ``png_path`` with
    ``relpos_lab.report.plot_ppl_vs_length`` and the file's SHA-256 as ``RESULTS_HASH_KEY``."""
    results = _load(Path(results_path))
    digest = results_digest(results_path)
    with tempfile.TemporaryDirectory() as tmp:
        drawn = Path(tmp) / "plot.png"
        report.plot_ppl_vs_length(drawn, results["rows"])
        data = add_png_text(drawn.read_bytes(), {RESULTS_HASH_KEY: digest})
    atomic_write(png_path, lambda path: Path(path).write_bytes(data))


# ------------------------------------------------------------------------------ recording


def record_run(run_dir: str | os.PathLike, root: Path, recording: dict[str, Any]) -> None:
    """Copy a finished demo run's ``results.json`` to ``root / RESULTS`` (checked first:
    ``check_demo_results``) and write ``recording`` with the copy's hash to ``RECORDING``."""
    source = Path(run_dir) / "results.json"
    data = _load(source)
    check_demo_results(data, str(source))
    target = root / RESULTS
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, lambda path: shutil.copyfile(source, path))
    record = {**recording, "source": str(source), "results_sha256": results_digest(target)}
    report.write_json_file(root / RECORDING, record)


class _LoadSampler:
    """The 1-minute load average, sampled every ``LOAD_SAMPLE_SECONDS`` in a thread."""

    def __init__(self) -> None:
        self.samples = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(LOAD_SAMPLE_SECONDS):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> _LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])


def rerun_demo() -> dict[str, Any]:
    """Run ``relpos demo`` in the current folder (into ``runs/demo``, replacing it); returns
    how it ran: wall and CPU seconds of this process, the load average (at the start, at the
    end, mean and max of samples every ``LOAD_SAMPLE_SECONDS``), the niceness at the start and
    the end, OMP_NUM_THREADS."""
    from .cli import main as relpos_main

    started = datetime.datetime.now(datetime.timezone.utc)
    nice = os.nice(0) if hasattr(os, "nice") else None
    cpu0, wall0 = time.process_time(), time.perf_counter()
    with _LoadSampler() as load:
        code = relpos_main(DEMO_COMMAND.split()[1:])
    if code != 0:
        raise RuntimeError(f"`{DEMO_COMMAND}` failed with exit code {code}")
    samples = load.samples
    return {
        "command": DEMO_COMMAND,
        "recorded_by": "python -m relpos_lab.readme_results --rerun",
        "started": started.isoformat(timespec="seconds"),
        "wall_seconds": round(time.perf_counter() - wall0, 1),
        "cpu_seconds": round(time.process_time() - cpu0, 1),
        "load_average": {
            "start": samples[0],
            "end": samples[-1],
            "mean": round(sum(samples) / len(samples), 2),
            "max": max(samples),
            "samples": len(samples),
            "every_seconds": LOAD_SAMPLE_SECONDS,
        },
        "nice": {"start": nice, "end": os.nice(0) if hasattr(os, "nice") else None},
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }


# ------------------------------------------------------------------------------ regeneration


def regenerate(root: Path, *, redraw: bool = False) -> list[str]:
    """Rewrite the README block and redraw the plot from the recorded files under ``root``
    (the plot only when it does not carry the recorded file's hash, or ``redraw``); returns
    what changed (paths relative to ``root``)."""
    results = _load(root / RESULTS)
    check_demo_results(results, str(RESULTS))
    recording_path = root / RECORDING
    recording = _load(recording_path) if recording_path.exists() else {}
    changed = []
    readme = root / README
    text = readme.read_text(encoding="utf-8")
    new = replace_block(text, render_block(results, recording))
    if new != text:
        atomic_write(readme, lambda path: Path(path).write_text(new, encoding="utf-8"))
        changed.append(str(README))
    png = root / PLOT
    digest = results_digest(root / RESULTS)
    if redraw or not png.exists() or png_text(png).get(RESULTS_HASH_KEY) != digest:
        png.parent.mkdir(parents=True, exist_ok=True)
        draw_plot(root / RESULTS, png)
        changed.append(str(PLOT))
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m relpos_lab.readme_results [--rerun | --from RUN] [--root DIR]``."""
    parser = argparse.ArgumentParser(
        prog="python -m relpos_lab.readme_results",
        description="Regenerate the README's demo table and plot from the recorded run "
        f"({RESULTS}); --rerun or --from first records a new `{DEMO_COMMAND}` run.",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--rerun",
        action="store_true",
        help=f"run `{DEMO_COMMAND}` (minutes; into ROOT/runs/demo) and record it",
    )
    source.add_argument("--from", dest="run_dir", help="record this finished demo run folder")
    parser.add_argument(
        "--root", default=".", help="the repository root, holding README.md (default: .)"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="redraw the plot even when it already carries the recorded file's hash",
    )
    args = parser.parse_args(argv)
    root = Path(args.root)
    try:
        if not (root / README).is_file():
            raise ValueError(f"--root {root}: holds no {README}")
        if args.rerun:
            os.chdir(root)
            root = Path(".")
            record_run("runs/demo", root, rerun_demo())
        elif args.run_dir:
            recording = {
                "recorded_by": f"python -m relpos_lab.readme_results --from {args.run_dir}"
            }
            record_run(args.run_dir, root, recording)
        changed = regenerate(root, redraw=args.force)
    except ValueError as err:
        print(f"relpos_lab.readme_results: error: {err}", file=sys.stderr)
        return 2
    print("updated: " + ", ".join(changed) if changed else "README block and plot up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
