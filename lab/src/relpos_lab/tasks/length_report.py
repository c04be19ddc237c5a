"""The report of the length suites of ``relpos tasks`` (``chomsky``, ``nope``, ``coupling``;
``suite.SuiteReport``, written by ``report.write_report``).

* ``results.csv``: one row per task x model x seed x length (``CSV_COLUMNS`` first);
* ``accuracy_<task>.png`` (``plot_task``): accuracy against length per model, the mean over
  seeds as a line and its 95 % interval as a band (seeds > 1), the train length dashed,
  chance dotted;
* ``report.md``: the summary table (test-length score: mean ± CI over seeds, max over seeds,
  the test examples' Wilson interval, the published reference), the plots and how to read
  them.

``summarize(rows)``: per task x model, the score of each seed (mean accuracy over the test
lengths, ``metrics.ood_score``), their mean, 95 % CI half-width, max, the mean accuracy at
the training lengths and, for the exact-match suites, the test examples pooled over seeds
with their Wilson interval (``metrics.wilson_interval``). ``print_table(summary)`` prints it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..report import _write_text, save_figure
from .chomsky import CHOMSKY_TASKS
from .jobs import TRAINING_COLUMNS
from .metrics import mean_ci, wilson_interval
from .references import REFERENCE_NOTES, reference
from .report import mean_ci_cell, print_summary_table, report_head, run_section

__all__ = [
    "summarize",
    "print_table",
    "markdown_summary",
    "plot_file",
    "plot_task",
    "write_markdown",
    "CSV_COLUMNS",
]

CSV_COLUMNS = (
    "suite", "task", "model", "encoding", "scheme", "seed", "length", "test", "accuracy",
    "token_accuracy", "n", "train_len", *TRAINING_COLUMNS,
)  # fmt: skip
#: suites scored by exact match per example (a binomial rate: Wilson intervals apply)
EXACT_MATCH_SUITES = ("nope", "coupling")
METRIC = {
    "chomsky": "per-token accuracy",
    "nope": "exact match",
    "coupling": "exact match",
}


def _chance(suite: str, task: str) -> float | None:
    if suite == "chomsky" and task in CHOMSKY_TASKS:
        return CHOMSKY_TASKS[task].chance
    return None


def _is_test(row: dict[str, Any]) -> bool:
    value = row["test"]
    return value if isinstance(value, bool) else str(value) == "True"


def _mean(pairs: list[tuple[float, float]]) -> float:
    return sum(a * w for a, w in pairs) / sum(w for _, w in pairs)


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One summary row per (task, model), in the rows' order."""
    groups: dict[tuple[str, str], dict[int, dict[str, list[float]]]] = {}
    suites: dict[tuple[str, str], str] = {}
    examples: dict[tuple[str, str], list] = {}  # exact-match suites: [hits, n] at test lengths
    for r in rows:
        key = (r["task"], r["model"])
        suites[key] = r["suite"]
        seed = groups.setdefault(key, {}).setdefault(int(r["seed"]), {"test": [], "train": []})
        # the NoPE study scores the mean over test examples, the others the mean over lengths
        weight = float(r["n"]) if r["suite"] == "nope" else 1.0
        seed["test" if _is_test(r) else "train"].append((float(r["accuracy"]), weight))
        if _is_test(r) and r["suite"] in EXACT_MATCH_SUITES:
            pooled = examples.setdefault(key, [0.0, 0])
            pooled[0] += float(r["accuracy"]) * int(r["n"])
            pooled[1] += int(r["n"])
    out = []
    for (task, model), seeds in groups.items():
        scores = [_mean(s["test"]) for s in seeds.values() if s["test"]]
        train = [_mean(s["train"]) for s in seeds.values() if s["train"]]
        if not scores:
            continue
        mean, ci = mean_ci(scores)
        suite = suites[(task, model)]
        hits, n = examples.get((task, model), (0.0, 0))
        wilson = list(wilson_interval(min(hits, n), n)) if n else None
        out.append(
            {
                "suite": suite,
                "task": task,
                "model": model,
                "seeds": len(scores),
                "scores": scores,
                "mean": mean,
                "ci": ci,
                "max": max(scores),
                "min": min(scores),
                "train_mean": sum(train) / len(train) if train else None,
                "reference": reference(suite, task, model),
                "chance": _chance(suite, task),
                "test_examples": n,
                "examples_ci": wilson,
            }
        )
    return out


def _cell(s: dict[str, Any]) -> str:
    return mean_ci_cell(s["mean"], s["ci"], s["seeds"])


def _examples_cell(s: dict[str, Any]) -> str:
    """``n [low, high]``: the pooled test examples and their Wilson interval (exact match)."""
    ci = s.get("examples_ci")
    if not ci:
        return "-"
    return f"{s['test_examples']} [{ci[0]:.3f}, {ci[1]:.3f}]"


def markdown_summary(summary: Sequence[dict[str, Any]]) -> str:
    """The summary as a markdown table (one row per task x model)."""
    lines = [
        "| task | model | test score (mean ± 95% CI) | max over seeds | test examples "
        "(95% Wilson) | train lengths | published | chance |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summary:
        ref = "-" if s["reference"] is None else f"{s['reference']:.3f}"
        chance = "-" if s["chance"] is None else f"{s['chance']:.2f}"
        train = "-" if s["train_mean"] is None else f"{s['train_mean']:.3f}"
        lines.append(
            f"| {s['task']} | `{s['model']}` | {_cell(s)} | {s['max']:.3f} | "
            f"{_examples_cell(s)} | {train} | {ref} | {chance} |"
        )
    return "\n".join(lines) + "\n"


def print_table(summary: Sequence[dict[str, Any]], file: Any = None) -> None:
    """The summary in the terminal (``report.print_summary_table``)."""
    if not summary:
        return
    cells = []
    for s in summary:
        ref = "-" if s["reference"] is None else f"{s['reference']:.3f}"
        train = "-" if s["train_mean"] is None else f"{s['train_mean']:.3f}"
        cells.append([s["task"], s["model"], _cell(s), f"{s['max']:.3f}", train, ref])
    print_summary_table(
        "test-length score: mean ± 95% CI over seeds (max), published",
        ("task", "model", "mean ± CI", "max", "train", "published"),
        cells,
        left=2,
        file=file,
    )


def plot_file(task: str) -> str:
    """The name of ``task``'s plot in the run folder."""
    return f"accuracy_{task}.png"


def plot_task(path: Path, rows: Sequence[dict[str, Any]], task: str) -> None:
    """Accuracy vs length for one task: mean over seeds per model, a 95 % CI band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .metrics import T_QUANTILE_975

    rows = [r for r in rows if r["task"] == task]
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, ax = plt.subplots(figsize=(7.0, 4.0))
    colors = plt.get_cmap("tab10")
    for k, model in enumerate(models):
        by_len: dict[int, list[float]] = {}
        for r in rows:
            if r["model"] == model:
                by_len.setdefault(int(r["length"]), []).append(float(r["accuracy"]))
        xs = sorted(by_len)
        means = [sum(by_len[x]) / len(by_len[x]) for x in xs]
        ax.plot(xs, means, color=colors(k % 10), linewidth=1.5, label=model)
        if max(len(v) for v in by_len.values()) > 1:
            lo, hi = [], []
            for x, m in zip(xs, means, strict=True):
                v = by_len[x]
                n = len(v)
                sd = math.sqrt(sum((a - m) ** 2 for a in v) / (n - 1)) if n > 1 else 0.0
                t = T_QUANTILE_975[min(n - 2, len(T_QUANTILE_975) - 1)] if n > 1 else 0.0
                lo.append(max(0.0, m - t * sd / math.sqrt(n)))
                hi.append(min(1.0, m + t * sd / math.sqrt(n)))
            ax.fill_between(xs, lo, hi, color=colors(k % 10), alpha=0.18, linewidth=0)
    first = rows[0]
    test = sorted({int(r["length"]) for r in rows if _is_test(r)})
    if first["suite"] != "nope" or first["task"] != "scan":
        ax.axvline(first["train_len"], color="0.35", linestyle="--", linewidth=1.0)
    elif test:
        ax.axvline(test[0] - 0.5, color="0.35", linestyle="--", linewidth=1.0)
    chance = _chance(first["suite"], task)
    if chance is not None:
        ax.axhline(chance, color="0.5", linestyle=":", linewidth=1.0)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("length (dashed: longest training length)")
    ax.set_ylabel(METRIC.get(first["suite"], "accuracy"))
    ax.set_title(f"{task}: mean over seeds, band = 95% CI", fontsize=10)
    ax.grid(True, alpha=0.25)
    ax.legend(fontsize=8, frameon=False, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    save_figure(fig, path)


HOW_TO_READ = """\
Each model was trained on lengths up to the dashed line and scored at every length up to
the longest test length. The *test score* of a seed is the mean {metric} over the test
lengths ({test}; for the NoPE study's tasks the mean over the test examples, as the paper).
The table gives its mean over seeds with a 95% Student-t interval (no interval for one seed)
and the max over seeds (the Chomsky papers report the max; the mean is much lower,
maintainer: Transformer on Even Pairs averages 67.7 ± 15.2 over 10 seeds). *train lengths*
is the mean score at the training lengths (did the model learn the task at all?). *test
examples* (exact-match suites): how many test examples the score pools over all seeds and
their 95% Wilson interval, the spread the evaluation sample alone allows (two models whose
intervals overlap are not told apart by this test set, whatever the seeds say).
*published*: {ref_note}. Chance is 1 / classes for the Chomsky tasks.
"""


def write_markdown(
    path: Path,
    rows: Sequence[dict[str, Any]],
    summary: Sequence[dict[str, Any]],
    meta: dict[str, Any],
    plots: Sequence[str],
) -> None:
    """``report.md``: the command and profile, the summary table, the plots, how to read
    them, the run."""
    first = rows[0] if rows else {}
    suite = first.get("suite", meta.get("suite", "?"))
    test = sorted({int(r["length"]) for r in rows if _is_test(r)})
    test_text = f"{test[0]}-{test[-1]}" if test else "-"
    detail = f"train lengths up to {first.get('train_len')}, test lengths {test_text}"
    lines = [
        *report_head(f"the {suite} suite", meta, first, detail),
        markdown_summary(summary).rstrip("\n"),
        "",
    ]
    for p in plots:
        lines += [f"![{p}]({p})", ""]
    if not plots:
        lines += ["(no plots: matplotlib was not installed)", ""]
    lines += [
        "## How to read it",
        "",
        HOW_TO_READ.format(
            metric=METRIC.get(suite, "accuracy"),
            test=test_text,
            ref_note=REFERENCE_NOTES.get(suite, "-"),
        ).rstrip("\n"),
        "",
        *run_section(meta),
    ]
    _write_text(path, "\n".join(lines))
