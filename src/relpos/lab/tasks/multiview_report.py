"""The report of ``relpos tasks --suite multiview`` (the run-folder contract of the other
suites).

``write_report(out_dir, rows, meta)`` writes, each file atomically:

* ``results.json`` (``{"meta", "summary", "rows"}``) and ``results.csv`` (one row per model
  x seed x condition: top-1 accuracy on the labelled target tokens, their count, the
  appearance-only expectation);
* ``correspondence.png``: left, accuracy against the strength of the rigid world change
  (0 = the training distribution; strength S rotates by S x 90 degrees and translates by 5 S)
  per model, the mean over seeds as a line and its 95 % interval as a band; right, the three
  headline conditions (in distribution, random rigid change, other reference camera) as bars
  with 95 % intervals; the appearance-only expectation dotted;
* ``report.md``: the exact command, the table (mean ± CI over seeds per condition, the drop
  under the rigid change), the spec's acceptance checks where their models ran, the plot,
  how to read it.

``summarize(rows)``: per model, for each condition, the seeds' accuracies, their mean, 95 %
CI half-width (``metrics.mean_ci``), min and max.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...optional import installed
from ..report import _write_text, save_figure, write_csv, write_json_file
from .correspondence import CONDITIONS, SWEEP
from .metrics import mean_ci
from .report import run_section

__all__ = ["summarize", "write_report", "print_table", "markdown_summary", "plot_run", "checks"]

CSV_COLUMNS = (
    "suite", "task", "model", "encoding", "plucker", "seed", "condition", "accuracy", "hits",
    "n", "appearance", "steps", "final_loss", "train_seconds", "dim", "depth", "heads",
    "batch", "lr",
)  # fmt: skip
HEADLINE = ("id", "rigid", "ref-swap")


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One summary row per model, in the rows' order."""
    groups: dict[str, dict[str, dict[int, float]]] = {}
    appearance: dict[str, list[float]] = {}
    for r in rows:
        cells = groups.setdefault(r["model"], {})
        cells.setdefault(r["condition"], {})[int(r["seed"])] = float(r["accuracy"])
        if r["condition"] == "id":
            appearance.setdefault(r["model"], []).append(float(r["appearance"]))
    out = []
    for model, cells in groups.items():
        entry: dict[str, Any] = {"model": model, "conditions": {}}
        for condition, seeds in cells.items():
            values = [seeds[s] for s in sorted(seeds)]
            mean, ci = mean_ci(values)
            entry["conditions"][condition] = {
                "values": values,
                "mean": mean,
                "ci": ci,
                "min": min(values),
                "max": max(values),
            }
        entry["seeds"] = max(len(c["values"]) for c in entry["conditions"].values())
        chance = appearance.get(model, [])
        entry["appearance"] = sum(chance) / len(chance) if chance else None
        out.append(entry)
    return out


def _cell(c: dict[str, Any] | None) -> str:
    if c is None:
        return "-"
    text = f"{c['mean']:.3f}"
    if len(c["values"]) > 1:
        text += f" ± {c['ci']:.3f}"
    return text


def _drop(s: dict[str, Any], condition: str) -> str:
    cells = s["conditions"]
    if "id" not in cells or condition not in cells:
        return "-"
    return f"{100 * (cells[condition]['mean'] - cells['id']['mean']):+.1f}"


def markdown_summary(summary: Sequence[dict[str, Any]]) -> str:
    """The summary as a markdown table (one row per model)."""
    lines = [
        "| model | in distribution | rigid change | Δ rigid (pt) | other reference | "
        "Δ reference (pt) | seeds |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        c = s["conditions"]
        lines.append(
            f"| `{s['model']}` | {_cell(c.get('id'))} | {_cell(c.get('rigid'))} | "
            f"{_drop(s, 'rigid')} | {_cell(c.get('ref-swap'))} | {_drop(s, 'ref-swap')} | "
            f"{s['seeds']} |"
        )
    return "\n".join(lines) + "\n"


def checks(summary: Sequence[dict[str, Any]]) -> list[str]:
    """The spec §5 acceptance checks whose models ran, each a markdown line with the
    numbers: PRoPE keeps its accuracy under the rigid change (within 0.5 pt); Plücker in
    world coordinates loses at least 10 pt; PRoPE costs at most 3 pt in distribution
    against it."""
    by = {s["model"]: s["conditions"] for s in summary}
    prope = by.get("prope")
    world = next((by[m] for m in by if m.endswith("+plucker")), None)
    world_name = next((m for m in by if m.endswith("+plucker")), None)
    out = []

    def mean(c: dict[str, Any], k: str) -> float:
        return 100 * c[k]["mean"]

    if prope and "rigid" in prope:
        a, b = mean(prope, "id"), mean(prope, "rigid")
        ok = b >= a - 0.5
        out.append(
            f"- PRoPE under the rigid change: {b:.1f} vs {a:.1f} in distribution "
            f"(needs >= {a - 0.5:.1f}): **{'met' if ok else 'not met'}**"
        )
    if world and "rigid" in world:
        a, b = mean(world, "id"), mean(world, "rigid")
        ok = b <= a - 10
        out.append(
            f"- `{world_name}` (world-frame Plücker) under the rigid change: {b:.1f} vs {a:.1f} "
            f"(needs <= {a - 10:.1f}): **{'met' if ok else 'not met'}**"
        )
    if prope and world:
        a, b = mean(prope, "id"), mean(world, "id")
        ok = a >= b - 3
        out.append(
            f"- PRoPE in distribution {a:.1f} vs `{world_name}` {b:.1f} (needs >= {b - 3:.1f}): "
            f"**{'met' if ok else 'not met'}**"
        )
    return out


def print_table(summary: Sequence[dict[str, Any]], file: Any = None) -> None:
    """The summary in the terminal (rich when installed)."""
    if not summary:
        return
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        out = file or sys.stdout
        for s in summary:
            cells = "".join(f"{_cell(s['conditions'].get(c)):>18}" for c in HEADLINE)
            print(f"{s['model']:<28}{cells}", file=out)
        return
    table = Table(title="correspondence top-1 accuracy: mean ± 95% CI over seeds")
    for name in ("model", "in distribution", "rigid change", "other reference"):
        table.add_column(name, justify="left" if name == "model" else "right")
    for s in summary:
        table.add_row(s["model"], *(_cell(s["conditions"].get(c)) for c in HEADLINE))
    (Console(file=file) if file is not None else Console()).print(table)


def _band(values: Sequence[float]) -> tuple[float, float, float]:
    mean, ci = mean_ci(list(values))
    return mean, max(0.0, mean - ci), min(1.0, mean + ci)


def plot_run(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """``correspondence.png`` (see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    cells: dict[str, dict[str, list[float]]] = {}
    chance: list[float] = []
    for r in rows:
        cells.setdefault(r["model"], {}).setdefault(r["condition"], []).append(float(r["accuracy"]))
        if r["condition"] == "id":
            chance.append(float(r["appearance"]))
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(9.0, 4.0), gridspec_kw={"width_ratios": [1.2, 1.0]}
    )
    colors = plt.get_cmap("tab10")
    xs = [0.0, *SWEEP]
    names = ["id", *(f"rigid-{s:g}" for s in SWEEP)]
    for k, model in enumerate(models):
        got = [(x, cells[model][n]) for x, n in zip(xs, names, strict=True) if n in cells[model]]
        if not got:
            continue
        bands = [_band(v) for _, v in got]
        x = [g[0] for g in got]
        left.plot(x, [b[0] for b in bands], color=colors(k % 10), marker="o", ms=3, label=model)
        if max(len(v) for _, v in got) > 1:
            left.fill_between(
                x, [b[1] for b in bands], [b[2] for b in bands], color=colors(k % 10), alpha=0.18,
                linewidth=0,
            )  # fmt: skip
    width = 0.8 / max(1, len(models))
    for k, model in enumerate(models):
        for j, condition in enumerate(HEADLINE):
            values = cells[model].get(condition)
            if not values:
                continue
            mean, lo, hi = _band(values)
            right.bar(
                j + (k - (len(models) - 1) / 2) * width, mean, width, color=colors(k % 10),
                yerr=[[mean - lo], [hi - mean]] if len(values) > 1 else None, capsize=2,
            )  # fmt: skip
    if chance:
        level = sum(chance) / len(chance)
        for ax in (left, right):
            ax.axhline(level, color="0.5", linestyle=":", linewidth=1.0)
    left.set_xlabel("rigid change: S x 90 deg rotation, |t| = 5 S")
    left.set_ylabel("top-1 correspondence accuracy")
    left.set_title("mean over seeds, band = 95% CI; dotted: appearance only", fontsize=9)
    right.set_xticks(range(len(HEADLINE)), ["in distribution", "rigid (|t|~5)", "other ref."])
    right.set_title("bars: mean, whiskers: 95% CI", fontsize=9)
    for ax in (left, right):
        ax.set_ylim(0.0, 1.02)
        ax.grid(True, alpha=0.25)
    handles, labels = left.get_legend_handles_labels()
    rows_of_legend = math.ceil(len(labels) / 5) if labels else 0
    fig.legend(handles, labels, loc="lower center", ncol=min(5, max(1, len(labels))),
               fontsize=8, frameon=False)  # fmt: skip
    fig.tight_layout(rect=(0.0, 0.06 * rows_of_legend + 0.02, 1.0, 1.0))
    save_figure(fig, path)


HOW_TO_READ = """\
Each model was trained on scenes at the origin (spec camera §5) to point, for every target
token, at the context token that sees the same sphere (labels: depth-consistent
reprojection, `relpos.lab.multiview`); the score is top-1 accuracy over the labelled target
tokens of {scenes} test scenes, the same scenes for every model and condition. *rigid
change*: every test scene moved by a random rigid transform (Haar rotation, |t| ~ 5);
*other reference*: the scene expressed in the frame of context camera 1 instead of the
canonical one (and `plucker-first` anchored at camera 1 instead of 0). The images and labels
are the same in every condition; only the coordinates the model is given change. A relative
encoding that is invariant to rigid changes (PRoPE, GTA, UCPE, CaPE-6DoF) must score the same
on all of them up to float32 rounding; world-frame Plücker rays are not invariant. The
dotted line is the appearance-only expectation ({chance}: a uniform guess among the context
tokens of the target's colour). Intervals are 95% Student-t over seeds (none for one seed).
"""


def write_markdown(
    path: Path,
    rows: Sequence[dict[str, Any]],
    summary: Sequence[dict[str, Any]],
    meta: dict[str, Any],
    plots: Sequence[str],
) -> None:
    first = rows[0] if rows else {}
    scenes = meta.get("settings", {}).get("eval_scenes", "?")
    chance = [s["appearance"] for s in summary if s["appearance"] is not None]
    chance_text = f"{sum(chance) / len(chance):.3f}" if chance else "-"
    lines = [
        "# relpos tasks: the multiview suite (cross-view correspondence)",
        "",
        "```sh",
        str(meta.get("command", "relpos tasks --suite multiview")),
        "```",
        "",
        f"Profile `{meta.get('profile', '?')}`: dim {first.get('dim')}, depth "
        f"{first.get('depth')}, {first.get('heads')} heads, batch {first.get('batch')} scenes, "
        f"lr {first.get('lr')}, {first.get('steps')} steps; conditions "
        f"{', '.join(CONDITIONS)}.",
        "",
        markdown_summary(summary).rstrip("\n"),
        "",
    ]
    found = checks(summary)
    if found:
        lines += ["Spec §5 acceptance checks (where their models ran):", "", *found, ""]
    for p in plots:
        lines += [f"![{p}]({p})", ""]
    if not plots:
        lines += ["(no plots: matplotlib was not installed)", ""]
    lines += [
        "## How to read it",
        "",
        HOW_TO_READ.format(scenes=scenes, chance=chance_text).rstrip("\n"),
        "",
        *run_section(meta),
    ]
    _write_text(path, "\n".join(lines))


def write_report(
    out_dir: str | Path, rows: Sequence[dict[str, Any]], meta: dict[str, Any]
) -> dict[str, Any]:
    """Write every report file into ``out_dir``; returns ``{"json", "csv", "md", "png":
    [paths], "summary"}``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows)
    write_json_file(out / "results.json", {"meta": meta, "summary": summary, "rows": list(rows)})
    write_csv(out / "results.csv", rows, CSV_COLUMNS)
    plots: list[str] = []
    if rows and installed("matplotlib"):
        plot_run(out / "correspondence.png", rows)
        plots.append("correspondence.png")
    write_markdown(out / "report.md", rows, summary, meta, plots)
    return {
        "json": out / "results.json",
        "csv": out / "results.csv",
        "md": out / "report.md",
        "png": [out / p for p in plots],
        "summary": summary,
    }
