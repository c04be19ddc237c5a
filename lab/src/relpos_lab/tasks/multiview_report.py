"""The report of the multiview suite of ``relpos tasks`` (``suite.SuiteReport``, written by
``report.write_report``).

* ``results.csv``: one row per task x model x seed x condition (``CSV_COLUMNS`` first;
  correspondence: top-1 accuracy on the labelled target tokens, their count, the
  appearance-only expectation; ``nvs``: the NMSE over the target tokens that see a sphere and
  over the labelled ones, their counts);
* ``correspondence.png`` (``plot_task``): left, accuracy against the strength of the rigid
  world change (0 = the training distribution; strength S rotates by S x 90 degrees and
  translates by 5 S) per model, the mean over seeds as a line and its 95 % interval as a
  band; right, the three headline conditions (in distribution, random rigid change, other
  reference camera) as bars with 95 % intervals; the appearance-only expectation dotted;
* ``nvs.png``: the same two panels for the target-feature regression's NMSE (lower is
  better; dotted: 1, predicting the mean appearance);
* ``report.md``: the table of each task (mean ± CI over seeds per condition, the change
  under the rigid change), the suite's acceptance checks where their models ran
  (``checks``), the plots, how to read them.

``summarize(rows)``: per task and model, for each condition, the seeds' values of the task's
metric (``METRICS``), their mean, 95 % CI half-width (``metrics.mean_ci``), min and max.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..report import _write_text, save_figure
from .correspondence import CONDITIONS, SWEEP
from .jobs import TRAINING_COLUMNS
from .metrics import mean_ci
from .report import mean_ci_cell, print_summary_table, report_head, run_section

__all__ = [
    "summarize",
    "of_task",
    "print_table",
    "markdown_summary",
    "plot_file",
    "plot_task",
    "write_markdown",
    "checks",
    "METRICS",
    "CSV_COLUMNS",
]

CSV_COLUMNS = (
    "suite", "task", "model", "encoding", "plucker", "seed", "condition", "accuracy", "hits",
    "n", "appearance", "nmse", "nmse_labelled", "n_labelled", "mse", *TRAINING_COLUMNS,
)  # fmt: skip
HEADLINE = ("id", "rigid", "ref-swap")
CORRESPONDENCE, NVS = "correspondence", "nvs"
#: the headline metric of each task (the others are kept in the rows)
METRICS = {CORRESPONDENCE: "accuracy", NVS: "nmse"}


def _task(row: dict[str, Any]) -> str:
    return str(row.get("task") or CORRESPONDENCE)


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One summary row per task x model, in the rows' order: ``{"task", "model", "metric",
    "conditions": {condition: {"values", "mean", "ci", "min", "max"}}, "seeds",
    "appearance"}`` (``labelled``: the NMSE over labelled tokens per condition, ``nvs``)."""
    groups: dict[tuple[str, str], dict[str, dict[int, float]]] = {}
    labelled: dict[tuple[str, str], dict[str, dict[int, float]]] = {}
    appearance: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        task = _task(r)
        key = (task, r["model"])
        cells = groups.setdefault(key, {})
        cells.setdefault(r["condition"], {})[int(r["seed"])] = float(r[METRICS[task]])
        if task == NVS:
            side = labelled.setdefault(key, {})
            side.setdefault(r["condition"], {})[int(r["seed"])] = float(r["nmse_labelled"])
        if task == CORRESPONDENCE and r["condition"] == "id":
            appearance.setdefault(key, []).append(float(r["appearance"]))
    out = []
    for (task, model), cells in groups.items():
        entry: dict[str, Any] = {
            "task": task,
            "model": model,
            "metric": METRICS[task],
            "conditions": _cells(cells),
        }
        if task == NVS:
            entry["labelled"] = _cells(labelled.get((task, model), {}))
        entry["seeds"] = max(len(c["values"]) for c in entry["conditions"].values())
        chance = appearance.get((task, model), [])
        entry["appearance"] = sum(chance) / len(chance) if chance else None
        out.append(entry)
    return out


def _cells(cells: dict[str, dict[int, float]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for condition, seeds in cells.items():
        values = [seeds[s] for s in sorted(seeds)]
        mean, ci = mean_ci(values)
        out[condition] = {
            "values": values,
            "mean": mean,
            "ci": ci,
            "min": min(values),
            "max": max(values),
        }
    return out


def of_task(summary: Sequence[dict[str, Any]], task: str) -> list[dict[str, Any]]:
    """The summary rows of one task."""
    return [s for s in summary if s.get("task", CORRESPONDENCE) == task]


def _cell(c: dict[str, Any] | None) -> str:
    return "-" if c is None else mean_ci_cell(c["mean"], c["ci"], len(c["values"]))


def _drop(s: dict[str, Any], condition: str) -> str:
    """The change from in distribution: points of accuracy, or NMSE units."""
    cells = s["conditions"]
    if "id" not in cells or condition not in cells:
        return "-"
    delta = cells[condition]["mean"] - cells["id"]["mean"]
    return f"{delta:+.3f}" if s.get("metric") == "nmse" else f"{100 * delta:+.1f}"


def markdown_summary(summary: Sequence[dict[str, Any]]) -> str:
    """The summary of one task as a markdown table (one row per model)."""
    if summary and summary[0].get("task") == NVS:
        return _nvs_table(summary)
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


def _nvs_table(summary: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| model | NMSE in distribution | rigid change | Δ rigid | other reference | "
        "Δ reference | NMSE, labelled tokens (in distribution) | seeds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        c = s["conditions"]
        lab = s.get("labelled", {})
        lines.append(
            f"| `{s['model']}` | {_cell(c.get('id'))} | {_cell(c.get('rigid'))} | "
            f"{_drop(s, 'rigid')} | {_cell(c.get('ref-swap'))} | {_drop(s, 'ref-swap')} | "
            f"{_cell(lab.get('id'))} | {s['seeds']} |"
        )
    return "\n".join(lines) + "\n"


def checks(summary: Sequence[dict[str, Any]]) -> list[str]:
    """The suite's acceptance checks whose models ran, each a markdown line with the
    numbers: PRoPE keeps its accuracy under the rigid change (within 0.5 pt); Plücker in
    world coordinates loses at least 10 pt; PRoPE costs at most 3 pt in distribution
    against it."""
    by = {s["model"]: s["conditions"] for s in of_task(summary, CORRESPONDENCE)}
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


TITLES = {
    CORRESPONDENCE: "correspondence top-1 accuracy: mean ± 95% CI over seeds",
    NVS: "target-feature regression NMSE (lower is better): mean ± 95% CI over seeds",
}


def print_table(summary: Sequence[dict[str, Any]], file: Any = None) -> None:
    """The summary in the terminal (rich when installed), one table per task."""
    tasks = list(dict.fromkeys(s.get("task", CORRESPONDENCE) for s in summary))
    for task in tasks:
        _print_task(of_task(summary, task), TITLES.get(task, task), file)


def _print_task(summary: Sequence[dict[str, Any]], title: str, file: Any) -> None:
    cells = [[s["model"], *(_cell(s["conditions"].get(c)) for c in HEADLINE)] for s in summary]
    columns = ("model", "in distribution", "rigid change", "other reference")
    print_summary_table(title, columns, cells, file=file)


def _band(values: Sequence[float], upper: float = 1.0) -> tuple[float, float, float]:
    mean, ci = mean_ci(list(values))
    return mean, max(0.0, mean - ci), min(upper, mean + ci)


def plot_file(task: str) -> str:
    """The name of ``task``'s plot in the run folder."""
    return f"{task}.png"


def plot_task(path: Path, rows: Sequence[dict[str, Any]], task: str) -> None:
    """``correspondence.png`` or ``nvs.png``: the rows of ``task`` (module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if _task(r) == task]
    metric = METRICS[task]
    models = list(dict.fromkeys(r["model"] for r in rows))
    cells: dict[str, dict[str, list[float]]] = {}
    chance: list[float] = []
    for r in rows:
        cells.setdefault(r["model"], {}).setdefault(r["condition"], []).append(float(r[metric]))
        if task == CORRESPONDENCE and r["condition"] == "id":
            chance.append(float(r["appearance"]))
    if task == NVS:
        chance = [1.0]  # predicting the mean appearance
    top, cap = 1.02, 1.0
    if task == NVS:
        cap = float("inf")
        top = max([1.05] + [1.05 * v for c in cells.values() for vs in c.values() for v in vs])
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
        bands = [_band(v, upper=cap) for _, v in got]
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
            mean, lo, hi = _band(values, upper=cap)
            right.bar(
                j + (k - (len(models) - 1) / 2) * width, mean, width, color=colors(k % 10),
                yerr=[[mean - lo], [hi - mean]] if len(values) > 1 else None, capsize=2,
            )  # fmt: skip
    if chance:
        level = sum(chance) / len(chance)
        for ax in (left, right):
            ax.axhline(level, color="0.5", linestyle=":", linewidth=1.0)
    left.set_xlabel("rigid change: S x 90 deg rotation, |t| = 5 S")
    if task == NVS:
        left.set_ylabel("target-feature NMSE (lower is better)")
        left.set_title("mean over seeds, band = 95% CI; dotted: the mean", fontsize=9)
    else:
        left.set_ylabel("top-1 correspondence accuracy")
        left.set_title("mean over seeds, band = 95% CI; dotted: appearance only", fontsize=9)
    right.set_xticks(range(len(HEADLINE)), ["in distribution", "rigid (|t|~5)", "other ref."])
    right.set_title("bars: mean, whiskers: 95% CI", fontsize=9)
    for ax in (left, right):
        ax.set_ylim(0.0, top)
        ax.grid(True, alpha=0.25)
    handles, labels = left.get_legend_handles_labels()
    rows_of_legend = math.ceil(len(labels) / 5) if labels else 0
    fig.legend(handles, labels, loc="lower center", ncol=min(5, max(1, len(labels))),
               fontsize=8, frameon=False)  # fmt: skip
    fig.tight_layout(rect=(0.0, 0.06 * rows_of_legend + 0.02, 1.0, 1.0))
    save_figure(fig, path)


HOW_TO_READ = """\
Each model was trained on scenes at the origin to point, for every target
token, at the context token that sees the same sphere (labels: depth-consistent
reprojection, `relpos_lab.tasks.scenes`); the score is top-1 accuracy over the labelled target
tokens of {scenes} test scenes, the same scenes for every model and condition. *rigid
change*: every test scene moved by a random rigid transform (Haar rotation, |t| ~ 5);
*other reference*: the scene expressed in the frame of context camera 1 instead of the
canonical one (and `plucker-first` anchored at camera 1 instead of 0). The images and labels
are the same in every condition; only the coordinates the model is given change. A relative
encoding that is invariant to rigid changes (PRoPE, GTA, UCPE, CaPE-6DoF, RayRoPE) must score
the same on all of them up to float32 rounding; world-frame Plücker rays are not invariant. The
dotted line is the appearance-only expectation ({chance}: a uniform guess among the context
tokens of the target's colour). Intervals are 95% Student-t over seeds (none for one seed).
"""


NVS_HOW_TO_READ = """\
*Target-feature regression* ("tiny NVS", the suite's second task): the same scenes
and conditions, but the target view's tokens get no appearance features, only their rays /
cameras; the model regresses each target token's noise-free appearance (the one-hot colour
of the sphere its centre ray hits, or background) from the context views. NMSE = squared
error / variance, pooled over the target tokens of the {scenes} test scenes that see a
sphere (1 = predicting the mean appearance, the dotted line; lower is better); the
*labelled tokens* column pools only the targets whose sphere is visible and unoccluded in a
context view (the ones the context can tell). Invariant encodings score the same in every
condition.
"""


def write_markdown(
    path: Path,
    rows: Sequence[dict[str, Any]],
    summary: Sequence[dict[str, Any]],
    meta: dict[str, Any],
    plots: Sequence[str],
) -> None:
    """``report.md``: the command and profile, each task's table (correspondence: with the
    acceptance checks) and plot, how to read them, the run."""
    first = rows[0] if rows else {}
    scenes = meta.get("settings", {}).get("eval_scenes", "?")
    corr = of_task(summary, CORRESPONDENCE)
    nvs = of_task(summary, NVS)
    chance = [s["appearance"] for s in corr if s["appearance"] is not None]
    chance_text = f"{sum(chance) / len(chance):.3f}" if chance else "-"
    title = "the multiview suite (cross-view correspondence, target-feature regression)"
    lines = report_head(title, meta, first, f"conditions {', '.join(CONDITIONS)}")
    if corr:
        lines += [
            "## Cross-view correspondence (top-1 accuracy)",
            "",
            markdown_summary(corr).rstrip("\n"),
            "",
        ]
        found = checks(summary)
        if found:
            lines += ["The suite's acceptance checks (where their models ran):", "", *found, ""]
        if "correspondence.png" in plots:
            lines += ["![correspondence.png](correspondence.png)", ""]
    if nvs:
        lines += [
            "## Target-feature regression (NMSE, lower is better)",
            "",
            markdown_summary(nvs).rstrip("\n"),
            "",
        ]
        if "nvs.png" in plots:
            lines += ["![nvs.png](nvs.png)", ""]
    if not plots:
        lines += ["(no plots: matplotlib was not installed)", ""]
    lines += ["## How to read it", ""]
    if corr:
        lines += [HOW_TO_READ.format(scenes=scenes, chance=chance_text).rstrip("\n"), ""]
    if nvs:
        lines += [NVS_HOW_TO_READ.format(scenes=scenes).rstrip("\n"), ""]
    lines += [*run_section(meta)]
    _write_text(path, "\n".join(lines))
