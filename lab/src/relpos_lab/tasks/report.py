"""The report of a ``relpos tasks`` run, for every suite (the run-folder contract of
``relpos extrapolate``).

``write_report(out_dir, rows, meta, suite_report)`` writes, each file atomically:

* ``results.json``: ``{"meta", "summary", "rows"}``; ``results.csv``: the rows, the suite's
  ``CSV_COLUMNS`` first;
* one plot per task (``suite_report.plot_file(task)``) when matplotlib is installed;
* ``report.md`` (``suite_report.write_markdown``): the exact command and the profile
  (``report_head``), the suite's tables and plots, how to read them, and the run
  (``run_section``).

The suites' own parts are ``length_report`` and ``multiview_report``
(``suite.SuiteReport``); ``print_summary_table`` shows a summary in the terminal.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from relpos.optional import installed

from ..report import write_csv, write_json_file
from ..terminal import Table, print_table
from .suite import SuiteReport

__all__ = ["write_report", "report_head", "run_section", "print_summary_table", "mean_ci_cell"]


def mean_ci_cell(mean: float, ci: float, seeds: int) -> str:
    """``"0.812 ± 0.031"`` (no interval for one seed)."""
    text = f"{mean:.3f}"
    if seeds > 1:
        text += f" ± {ci:.3f}"
    return text


def print_summary_table(
    title: str,
    columns: Sequence[str],
    cells: Sequence[Sequence[str]],
    *,
    left: int = 1,
    file: Any = None,
) -> None:
    """A table in the terminal (``relpos_lab.terminal``: rich on a terminal wide enough,
    aligned text otherwise): the first ``left`` columns aligned left, the others right."""
    table = Table(title, columns, cells, right=frozenset(range(left, len(columns))))
    print_table(table, file)


def report_head(title: str, meta: dict[str, Any], first: dict[str, Any], detail: str) -> list[str]:
    """The first lines of ``report.md``: the title, the exact command, the profile's sizes
    (read from the first row) and ``detail`` (how the models were trained and tested)."""
    return [
        f"# relpos tasks: {title}",
        "",
        "```sh",
        str(meta.get("command", "relpos tasks")),
        "```",
        "",
        f"Profile `{meta.get('profile', '?')}`: dim {first.get('dim')}, depth "
        f"{first.get('depth')}, {first.get('heads')} heads, batch {first.get('batch')}, lr "
        f"{first.get('lr')}, {first.get('steps')} steps; {detail}.",
        "",
    ]


def run_section(meta: dict[str, Any]) -> list[str]:
    """The report's "## Run" lines: wall time, CPUs and load, workers, versions."""
    machine = meta.get("machine", {})
    load = machine.get("load_average")
    wall = meta.get("wall_seconds")
    workers = meta.get("workers")
    return [
        "## Run",
        "",
        (f"Wall time {wall:.0f} s" if isinstance(wall, (int, float)) else "Wall time -")
        + f" on {machine.get('cpu_count', '?')} CPUs"
        + (f" (load average {load[0]:.2f} at the start)" if load else "")
        + (
            f", {workers} worker processes of one thread each"
            if isinstance(workers, int) and workers > 1
            else f", one process ({machine.get('torch_threads', '?')} torch threads)"
        )
        + "; relpos "
        f"{meta.get('versions', {}).get('relpos', '?')}, torch "
        f"{meta.get('versions', {}).get('torch', '?')}. Raw numbers: `results.csv`, "
        "`results.json`.",
        "",
    ]


def write_report(
    out_dir: str | Path,
    rows: Sequence[dict[str, Any]],
    meta: dict[str, Any],
    suite_report: SuiteReport,
) -> dict[str, Any]:
    """Write every report file into ``out_dir``; returns ``{"json", "csv", "md", "png":
    [paths], "summary"}``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = suite_report.summarize(rows)
    write_json_file(out / "results.json", {"meta": meta, "summary": summary, "rows": list(rows)})
    write_csv(out / "results.csv", rows, suite_report.CSV_COLUMNS)
    plots: list[str] = []
    if rows and installed("matplotlib"):
        for task in dict.fromkeys(str(r["task"]) for r in rows):
            name = suite_report.plot_file(task)
            suite_report.plot_task(out / name, rows, task)
            plots.append(name)
    suite_report.write_markdown(out / "report.md", rows, summary, meta, plots)
    return {
        "json": out / "results.json",
        "csv": out / "results.csv",
        "md": out / "report.md",
        "png": [out / p for p in plots],
        "summary": summary,
    }
