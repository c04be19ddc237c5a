"""The report of a ``relpos extrapolate`` run: JSON, CSV, a plot, markdown, a terminal table.

``write_report(out_dir, rows, meta)`` writes, each file atomically:

* ``results.json``: ``{"meta": ..., "rows": [...]}`` (command, versions, machine, profile,
  seed, wall time, and one row per encoding x length x mode);
* ``results.csv``: the rows;
* ``ppl_vs_length.png``: perplexity (log scale) against evaluation length (log2 axis), one
  line per encoding, the train length dashed; left panel non-overlapping, right sliding;
* ``report.md``: the exact command, the tables, the plot and how to read them.

``print_table(rows)`` prints the perplexity table with rich (plain text without it).
"""

from __future__ import annotations

import csv
import io
import json
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from relpos.optional import installed

from .intervals import mean_ci
from .io import (
    atomic_write,
    check_output_dir,
    save_figure,  # PNG via atomic_write, then closed
)
from .terminal import Table
from .terminal import print_table as print_table_text

MODE_TITLES = {
    "nonoverlapping": "non-overlapping windows (every token scored)",
    "sliding": "sliding windows (only tokens with >= 3/4 of a window of context scored)",
}
CSV_COLUMNS = (
    "encoding",
    "family",
    "mode",
    "train_len",
    "eval_len",
    "mult",
    "ppl",
    "nll",
    "tokens_scored",
    "windows",
    "stride",
    "seed",
    "steps",
    "final_loss",
    "train_seconds",
    "tokens_per_second",
    "eval_seconds",
    "dim",
    "depth",
    "heads",
    "init",
    "head",
    "batch",
    "lr",
    "backend",
    "encoding_options",
    "split",
    "profile",
)


def _write_text(path: Path, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)

    atomic_write(path, write)


def write_json_file(path: Path, data: Any) -> None:
    """``data`` as indented JSON (2 spaces, final newline), written atomically."""
    _write_text(path, json.dumps(data, indent=2) + "\n")


# ------------------------------------------------------------------------------ run folders


def run_record_kind(path: Path, run_file: str) -> str | None:
    """What ``path / run_file`` says about the folder: its ``"kind"``, ``"corrupt"`` when the
    file is there but is no JSON object with a string ``kind``, or None when it is missing."""
    record = path / run_file
    if not record.exists():
        return None
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return "corrupt"
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        return "corrupt"
    return data["kind"]


def is_run_folder(path: Path, run_file: str, run_kind: str) -> bool:
    """Whether ``path / run_file`` is a JSON object with ``"kind": run_kind``."""
    return run_record_kind(path, run_file) == run_kind


def check_run_folder(
    out_dir: Path, *, resume: bool, force: bool, run_file: str, run_kind: str, what: str
) -> bool:
    """Validate a run's ``--out`` folder (raises ``ValueError``); returns True when ``--force``
    will clear an old run. ``run_file`` / ``run_kind`` mark a folder as a run of this kind,
    ``what`` names it in messages ("relpos run").

    The folder must be creatable and writable (``relpos_lab.io.check_output_dir``). A folder whose
    ``run_file`` is corrupt (hand-edited, not JSON) is still a run folder for ``--force``,
    which replaces it; ``--resume`` refuses it."""
    if resume and force:
        raise ValueError("--resume and --force exclude each other (continue or start over?)")
    check_output_dir(out_dir, "--out")
    if not out_dir.exists() or not any(out_dir.iterdir()):
        return False
    kind = run_record_kind(out_dir, run_file)
    if kind == "corrupt":
        if force:
            return True
        raise ValueError(
            f"--out {out_dir}: its {run_file} is corrupt (not a run record); use --force to "
            "start over"
        )
    if kind != run_kind:
        raise ValueError(
            f"--out {out_dir} is not empty and holds no {what} ({run_file} missing); "
            f"choose another --out (--force only replaces {what}s)"
        )
    if force:
        return True
    if resume:
        return False
    raise ValueError(
        f"--out {out_dir} already holds a run; pass --resume to continue it or --force to "
        "replace it"
    )


# ------------------------------------------------------------------------------ metadata


def run_metadata(**extra: Any) -> dict[str, Any]:
    """Versions and machine: relpos, torch, python, platform, CPU count, threads, load."""
    import torch

    import relpos

    meta: dict[str, Any] = {
        "versions": {
            "relpos": relpos.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "machine": {
            "platform": platform.platform(),
            "processor": platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.is_available(),
        },
    }
    try:
        meta["machine"]["load_average"] = [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        pass
    meta.update(extra)
    return meta


# ------------------------------------------------------------------------------ tables


def _modes(rows: Sequence[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["mode"] for r in rows))


def _encodings(rows: Sequence[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["encoding"] for r in rows))


def _lengths(rows: Sequence[dict[str, Any]]) -> list[int]:
    return sorted({int(r["eval_len"]) for r in rows})


def _seed_values(rows: Sequence[dict[str, Any]], mode: str) -> dict[str, dict[int, list[float]]]:
    """``{encoding: {eval_len: [ppl of each seed]}}`` for one mode."""
    values: dict[str, dict[int, list[float]]] = {}
    for r in rows:
        if r["mode"] == mode:
            values.setdefault(r["encoding"], {}).setdefault(int(r["eval_len"]), []).append(
                float(r["ppl"])
            )
    return values


def ppl_grid(rows: Sequence[dict[str, Any]], mode: str) -> dict[str, dict[int, float]]:
    """``{encoding: {eval_len: ppl}}`` for one mode (the mean over seeds when the rows hold
    several)."""
    return {
        name: {n: sum(v) / len(v) for n, v in by_len.items()}
        for name, by_len in _seed_values(rows, mode).items()
    }


def ppl_ci(rows: Sequence[dict[str, Any]], mode: str) -> dict[str, dict[int, float]]:
    """``{encoding: {eval_len: half-width}}`` of the 95 % Student-t interval of the mean
    over seeds (0 with one seed)."""

    return {
        name: {n: mean_ci(v)[1] for n, v in by_len.items()}
        for name, by_len in _seed_values(rows, mode).items()
    }


def _n_seeds(rows: Sequence[dict[str, Any]]) -> int:
    return len({r.get("seed") for r in rows})


def _cell(mean: float, ci: float, seeds: int) -> str:
    return f"{mean:.2f} ± {ci:.2f}" if seeds > 1 else f"{mean:.2f}"


def _ratio(values: dict[int, float], train_len: int) -> float | None:
    """ppl at the longest length over ppl at the train length (or the shortest)."""
    if not values:
        return None
    base = values.get(train_len, values[min(values)])
    return values[max(values)] / base


def markdown_tables(rows: Sequence[dict[str, Any]]) -> str:
    """One markdown table per mode: ppl per encoding x length, and longest / train length."""
    if not rows:
        return "(no results)\n"
    train_len = int(rows[0]["train_len"])
    lengths = _lengths(rows)
    parts = []
    for mode in _modes(rows):
        grid, ci, seeds = ppl_grid(rows, mode), ppl_ci(rows, mode), _n_seeds(rows)
        head = ["encoding", *[f"{n} ({n / train_len:g}L)" for n in lengths], "ratio"]
        lines = [
            f"**{MODE_TITLES.get(mode, mode)}**",
            "",
            "| " + " | ".join(head) + " |",
            "|---|" + "---:|" * (len(head) - 1),
        ]
        for name, values in grid.items():
            cells = [f"`{name}`"]
            cells += [_cell(values[n], ci[name][n], seeds) if n in values else "-" for n in lengths]
            ratio = _ratio(values, train_len)
            cells.append("-" if ratio is None else f"{ratio:.2f}x")
            lines.append("| " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def print_table(rows: Sequence[dict[str, Any]], file: Any = None) -> None:
    """The perplexity tables in the terminal (``relpos_lab.terminal``: rich on a terminal
    wide enough, aligned text otherwise), one per evaluation mode."""
    if not rows:
        return
    train_len = int(rows[0]["train_len"])
    lengths = _lengths(rows)
    for mode in _modes(rows):
        title = "non-overlapping" if mode == "nonoverlapping" else mode
        seeds = _n_seeds(rows)
        over = f", mean ± 95% CI over {seeds} seeds" if seeds > 1 else ""
        columns = ["encoding", *(f"{n} ({n / train_len:g}L)" for n in lengths)]
        columns.append(f"{max(lengths)} / {train_len}")
        ci = ppl_ci(rows, mode)
        body = []
        for name, values in ppl_grid(rows, mode).items():
            ratio = _ratio(values, train_len)
            cells = [_cell(values[n], ci[name][n], seeds) if n in values else "-" for n in lengths]
            style = "green" if ratio is not None and ratio <= 1.15 else "red"
            body.append([name, *cells, f"[{style}]{ratio:.2f}x[/]" if ratio else "-"])
        table = Table(
            f"perplexity, {title} windows (trained at L={train_len}){over}",
            columns,
            body,
            right=frozenset(range(1, len(columns))),
        )
        print_table_text(table, file)


# ------------------------------------------------------------------------------ files


def write_csv(
    path: Path, rows: Sequence[dict[str, Any]], first_columns: Sequence[str] = CSV_COLUMNS
) -> None:
    """``rows`` as CSV: ``first_columns`` in order, then any other keys sorted; missing
    cells empty."""
    buf = io.StringIO()
    columns = list(first_columns) + sorted({k for r in rows for k in r} - set(first_columns))
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: r.get(k, "") for k in columns})
    _write_text(path, buf.getvalue())


def write_json(path: Path, rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> None:
    write_json_file(path, {"meta": meta, "rows": list(rows)})


def length_axis(ax: Any, lengths: Sequence[int], label: str, trained: int | None = None) -> None:
    """A log2 x axis of sequence lengths on the matplotlib axes ``ax``: ticks (plain numbers)
    at ``lengths`` only, labelled ``label``; the trained length as a dashed line when given,
    inside the plotted range even when no measured length reaches it."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    if trained:
        ax.axvline(trained, color="0.35", linestyle="--", linewidth=1.0)
    ax.set_xscale("log", base=2)
    low, high = min(lengths[0], trained or lengths[0]), max(lengths[-1], trained or lengths[-1])
    ax.set_xlim(low / 1.25, high * 1.25)
    ax.xaxis.set_major_locator(FixedLocator(lengths))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.set_xlabel(label)


def plot_ppl_vs_length(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Log-scale perplexity vs evaluation length (log2 axis), one panel per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    modes = _modes(rows)
    train_len = int(rows[0]["train_len"])
    lengths = _lengths(rows)
    fig, axes = plt.subplots(
        1, len(modes), figsize=(4.6 * len(modes) + 1.6, 4.0), squeeze=False, sharey=True
    )
    colors = plt.get_cmap("tab10")
    encs = _encodings(rows)
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    handles = {}
    for ax, mode in zip(axes[0], modes, strict=True):
        grid, ci = ppl_grid(rows, mode), ppl_ci(rows, mode)
        for k, name in enumerate(encs):
            values = grid.get(name, {})
            if not values:
                continue
            xs = sorted(values)
            if any(ci[name][x] > 0 for x in xs):  # seeds > 1: the 95 % interval as a band
                ax.fill_between(
                    xs,
                    [max(values[x] - ci[name][x], 1e-3) for x in xs],
                    [values[x] + ci[name][x] for x in xs],
                    color=colors(k % 10),
                    alpha=0.15,
                    linewidth=0,
                )
            (line,) = ax.plot(
                xs,
                [values[x] for x in xs],
                marker="o",
                markersize=3.5,
                linewidth=1.6,
                linestyle="-" if mode == "nonoverlapping" else (0, (4, 1.5)),
                color=colors(k % 10),
                label=name,
            )
            handles.setdefault(name, line)
        length_axis(ax, lengths, "evaluation length (tokens)", trained=train_len)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(1.5, 2.0, 3.0, 5.0, 7.0)))
        ax.yaxis.set_minor_formatter(plain)
        title = "non-overlapping" if mode == "nonoverlapping" else mode
        ax.set_title(f"{title} windows", fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
    axes[0][0].set_ylabel("perplexity (log scale)")
    fig.legend(list(handles.values()), list(handles), loc="center right", fontsize=8, frameon=False)
    fig.suptitle(
        f"trained at L = {train_len} tokens (dashed vertical line); lower is better", fontsize=10
    )
    fig.tight_layout(rect=(0, 0, 1 - 1.5 / (4.6 * len(modes) + 1.6), 1))
    save_figure(fig, path)


HOW_TO_READ = """\
Each model was trained on windows of L = {train_len} tokens and then evaluated on unseen text
in windows of 1x to {max_mult:g}x that length. *Non-overlapping* cuts the text into windows of
the evaluation length and scores every token; longer windows have fewer tokens with little
context, which alone lowers perplexity a little. *Sliding* scores only the last quarter of
each window (windows advance by a quarter), so every scored token sees at least 3/4 of the
window as context: it shows whether a model copes with long context rather than just
profiting from fewer early tokens. *ratio* is the perplexity at the longest length over the
perplexity at L: an encoding that extrapolates stays near 1 (within 15%: ratio <= 1.15); one
that does not rises sharply right after L. In the Train-Short-Test-Long papers (ALiBi,
KERPLE, FIRE) sinusoidal and NoPE blow up past L, RoPE degrades within a few multiples of L,
and ALiBi, KERPLE and FIRE stay flat.
"""


def write_markdown(
    path: Path, rows: Sequence[dict[str, Any]], meta: dict[str, Any], *, plot: bool = True
) -> None:
    train_len = int(rows[0]["train_len"]) if rows else 0
    mults = [float(r["mult"]) for r in rows] or [1.0]
    first = rows[0] if rows else {}
    cfg = (
        f"dim {first.get('dim')}, depth {first.get('depth')}, {first.get('heads')} heads, "
        + (f"{first['init']} init, {first['head']} head, " if "init" in first else "")
        + f"batch {first.get('batch')}, lr {first.get('lr')}, {first.get('steps')} steps, "
        + (
            f"seeds {', '.join(map(str, meta['seeds']))} (cells: mean ± 95% CI)"
            if len(meta.get("seeds", [])) > 1
            else f"seed {first.get('seed')}"
        )
    )
    machine = meta.get("machine", {})
    versions = meta.get("versions", {})
    corpus = meta.get("corpus", {})
    lines = [
        "# relpos extrapolate: train short, test long",
        "",
        "```sh",
        str(meta.get("command", "relpos extrapolate")),
        "```",
        "",
        f"Profile `{meta.get('profile', '?')}`: {cfg}. Data: {corpus.get('name', '?')} "
        f"({corpus.get('tokenizer', '?')} tokens, vocab {corpus.get('vocab_size', '?')}), "
        f"evaluated on the `{first.get('split', '?')}` split (unseen in training), the same "
        "text span and the same number of scored tokens at every length.",
        "",
        markdown_tables(rows).rstrip("\n"),
        "",
        "![perplexity vs evaluation length](ppl_vs_length.png)"
        if plot
        else "(no plot: matplotlib was not installed)",
        "",
        "## How to read it",
        "",
        HOW_TO_READ.format(train_len=train_len, max_mult=max(mults)).rstrip("\n"),
        "",
        "## Run",
        "",
        "| encoding | final train loss | train time (s) | tokens/s |",
        "|---|---:|---:|---:|",
    ]
    seen = set()
    for r in rows:
        if r["encoding"] in seen:
            continue
        seen.add(r["encoding"])
        lines.append(
            f"| `{r['encoding']}` | {float(r['final_loss']):.3f} | "
            f"{float(r['train_seconds']):.0f} | {float(r['tokens_per_second']):,.0f} |"
        )
    wall = meta.get("wall_seconds")
    load = machine.get("load_average")
    lines += [
        "",
        f"Wall time {wall:.0f} s" if isinstance(wall, (int, float)) else "Wall time -",
        f"on {machine.get('cpu_count', '?')} CPUs ({machine.get('torch_threads', '?')} torch "
        f"threads{f', load average {load[0]:.2f} at the start' if load else ''}); relpos "
        f"{versions.get('relpos', '?')}, torch {versions.get('torch', '?')}, python "
        f"{versions.get('python', '?')}. Raw numbers: `results.csv`, `results.json`.",
        "",
    ]
    _write_text(path, "\n".join(lines))


def write_report(
    out_dir: str | os.PathLike, rows: Sequence[dict[str, Any]], meta: dict[str, Any]
) -> dict[str, Path]:
    """Write results.json, results.csv, ppl_vs_length.png and report.md into ``out_dir``;
    returns their paths. Without matplotlib there is no PNG (no ``"png"`` key, and the
    markdown says so instead of linking it)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out / "results.json",
        "csv": out / "results.csv",
        "png": out / "ppl_vs_length.png",
        "md": out / "report.md",
    }
    write_json(paths["json"], rows, meta)
    write_csv(paths["csv"], rows)
    if rows and installed("matplotlib"):
        plot_ppl_vs_length(paths["png"], rows)
    else:
        del paths["png"]
    write_markdown(paths["md"], rows, meta, plot="png" in paths)
    return paths


__all__ = [
    "write_report",
    "print_table",
    "markdown_tables",
    "ppl_grid",
    "run_metadata",
    "plot_ppl_vs_length",
    "length_axis",
    "save_figure",
]
