"""The report of a ``relpos longctx`` run: tables, CSV, the plot and the markdown.

``write_outputs(out_dir, state, meta)`` writes, each atomically: ``results.json`` (meta, rows,
per-trial details), ``results.csv`` (one row per method x length), ``longctx.png`` (passkey
accuracy and perplexity vs length) and ``report.md``. ``print_table`` prints the tables in the
terminal. The shared writers (JSON, CSV, text) are ``relpos_lab.report``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from relpos.optional import installed

from .. import report as lab_report
from ..terminal import Table
from ..terminal import print_table as print_table_text
from .methods import METHODS
from .run import RunState

__all__ = [
    "PLOT_FILE",
    "CSV_COLUMNS",
    "markdown_tables",
    "print_table",
    "write_csv",
    "plot",
    "write_markdown",
    "write_outputs",
]

PLOT_FILE = "longctx.png"

# ------------------------------------------------------------------------------ tables


# ------------------------------------------------------------------------------ report

CSV_COLUMNS = (
    "method",
    "encoding",
    "options",
    "length",
    "passkey_accuracy",
    "passkey_correct",
    "passkey_trials",
    "prompt_tokens",
    "passkey_seconds",
    "ppl",
    "nll",
    "ppl_tokens",
    "ppl_seconds",
    "seconds",
)


def _grid(rows: Sequence[dict[str, Any]], key: str) -> dict[str, dict[int, Any]]:
    grid: dict[str, dict[int, Any]] = {}
    for r in rows:
        if key in r:
            grid.setdefault(r["method"], {})[int(r["length"])] = r
    return grid


def _lengths(rows: Sequence[dict[str, Any]]) -> list[int]:
    return sorted({int(r["length"]) for r in rows})


def _cell(r: dict[str, Any] | None, key: str) -> str:
    if r is None:
        return "-"
    if key == "passkey":
        return f"{r['passkey_correct']}/{r['passkey_trials']}"
    return f"{r['ppl']:.2f}"


def markdown_tables(rows: Sequence[dict[str, Any]], trained: int | None = None) -> str:
    """Passkey and perplexity tables (methods x lengths) in markdown."""
    lengths = _lengths(rows)
    parts = []
    for key, title, field_name in (
        ("passkey", "passkey retrieval (correct / trials)", "passkey_trials"),
        ("ppl", "perplexity of the same final tokens given `length` tokens", "ppl"),
    ):
        grid = _grid(rows, field_name)
        if not grid:
            continue
        head = ["method", *[_length_label(n, trained) for n in lengths]]
        lines = [
            f"**{title}**",
            "",
            "| " + " | ".join(head) + " |",
            "|---|" + "---:|" * len(lengths),
        ]
        for name, cells in grid.items():
            lines.append(
                "| "
                + " | ".join([f"`{name}`", *[_cell(cells.get(n), key) for n in lengths]])
                + " |"
            )
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def _length_label(n: int, trained: int | None, sep: str = " ") -> str:
    return f"{n}" if not trained else f"{n}{sep}({n / trained:.3g}x)"


def print_table(rows: Sequence[dict[str, Any]], trained: int | None = None, file: Any = None):
    """The passkey and perplexity tables in the terminal (``relpos_lab.terminal``)."""
    if not rows:
        return
    lengths = _lengths(rows)
    passkey, ppl = _grid(rows, "passkey_trials"), _grid(rows, "ppl")
    parts = [p for p, grid in (("passkey", passkey), ("ppl", ppl)) if grid]
    body = []
    for name in dict.fromkeys(r["method"] for r in rows):
        out = []
        for n in lengths:
            cells = []
            r = passkey.get(name, {}).get(n)
            if "passkey" in parts:
                text = _cell(r, "passkey")
                if r is not None:
                    text = f"[{'green' if r['passkey_accuracy'] >= 0.5 else 'red'}]{text}[/]"
                cells.append(text)
            if "ppl" in parts:
                cells.append(_cell(ppl.get(name, {}).get(n), "ppl"))
            out.append("  ".join(cells))
        body.append([name, *out])
    table = Table(
        " and ".join(
            {"passkey": "passkey (correct/trials)", "ppl": "perplexity"}[p] for p in parts
        ),
        ["method", *(_length_label(n, trained) for n in lengths)],
        body,
        caption=f"trained context {trained} tokens" if trained else "",
        right=frozenset(range(1, len(lengths) + 1)),
    )
    print_table_text(table, file)


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    lab_report.write_csv(path, rows, CSV_COLUMNS)


#: per method: a marker and a dash pattern, so methods with equal values stay visible
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
DASHES = ("-", "--", "-.", ":")
#: methods are drawn side by side around each length: ``x * 2**(DODGE * offset)``
DODGE = 0.035


def plot(path: Path, rows: Sequence[dict[str, Any]], trained: int | None = None) -> None:
    """``figure(rows, trained)`` saved to ``path`` (PNG, atomically)."""
    fig = figure(rows, trained)
    if fig is not None:
        lab_report.save_figure(fig, path)


def figure(rows: Sequence[dict[str, Any]], trained: int | None = None) -> Any:
    """Passkey accuracy (left) and perplexity (right, log scale) against prompt length (log2
    axis), one line per method; the trained context dashed (None without rows to draw).
    Methods often agree exactly (every method is the baseline below the trained length; a
    passkey is found 100 % by several): each method has its own marker and dash pattern and
    is drawn slightly beside the others (``DODGE``), so no method hides under another."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    lengths = _lengths(rows)
    panels = [
        (key, title)
        for key, title in (
            ("passkey_trials", "passkey retrieval accuracy (%)"),
            ("ppl", "perplexity of the final tokens (log scale)"),
        )
        if _grid(rows, key)
    ]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels) + 1.6, 4.0), squeeze=False)
    colors = plt.get_cmap("tab10")
    methods = list(dict.fromkeys(r["method"] for r in rows))
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    handles = {}
    for ax, (key, title) in zip(axes[0], panels, strict=True):
        grid = _grid(rows, key)
        for k, name in enumerate(methods):
            cells = grid.get(name, {})
            if not cells:
                continue
            xs = sorted(cells)
            if key == "ppl":
                ys = [cells[x]["ppl"] for x in xs]
            else:
                ys = [100 * cells[x]["passkey_accuracy"] for x in xs]
            shift = 2 ** (DODGE * (k - (len(methods) - 1) / 2))
            (line,) = ax.plot(
                [x * shift for x in xs],
                ys,
                marker=MARKERS[k % len(MARKERS)],
                linestyle=DASHES[(k // len(MARKERS)) % len(DASHES)],
                markersize=4.0,
                linewidth=1.4,
                color=colors(k % 10),
                label=name,
            )
            handles.setdefault(name, line)
        lab_report.length_axis(ax, lengths, "prompt length (tokens)", trained=trained)
        if key == "ppl":
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain)
        else:
            ax.set_ylim(-5, 105)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
    labels = [
        f"{n} ({METHODS[n].label})" if n in METHODS and METHODS[n].label else n for n in handles
    ]
    fig.legend(list(handles.values()), labels, loc="center right", fontsize=8, frameon=False)
    suffix = f"; trained context {trained} tokens (dashed)" if trained else ""
    fig.suptitle(f"training-free context extension{suffix}", fontsize=10)
    width = 4.8 * len(panels) + 1.6
    fig.tight_layout(rect=(0, 0, 1 - 2.6 / width, 1))
    return fig


# ------------------------------------------------------------------------------ files

HOW_TO_READ = """\
Every method runs the same pretrained weights; only the rotary encoding changes, nothing is
fine-tuned. *Passkey*: a random key hides at several depths inside filler text of the given
length (Landmark format); the model must repeat it (greedy decoding, first integer). A method
that extends the context keeps finding it past the trained length. *Perplexity*: the same final
{ppl_tokens} tokens of held-out text, scored with `length` tokens of context; it should stay
flat or fall as the context grows, and rises when positions past the trained length confuse
the model.
"""


def write_markdown(path: Path, state: RunState, meta: dict[str, Any], *, plot: bool = True) -> None:
    trained = meta.get("model", {}).get("max_position_embeddings")
    settings = meta.get("settings", {})
    lines = [
        "# relpos longctx: training-free context extension",
        "",
        "```sh",
        str(meta.get("command", "relpos longctx")),
        "```",
        "",
        f"Model: {meta.get('model', {}).get('name', '?')} (trained context {trained}). "
        f"Held-out text: {meta.get('data', {}).get('name', '?')}. Passkey depths "
        f"{settings.get('depths')}, {settings.get('seeds')} seed(s) per depth.",
        "",
        markdown_tables(state.rows, trained).rstrip("\n"),
        "",
        f"![passkey accuracy and perplexity vs length]({PLOT_FILE})"
        if plot
        else "(no plot: matplotlib was not installed)",
        "",
        "## How to read it",
        "",
        HOW_TO_READ.format(ppl_tokens=settings.get("ppl_tokens", "?")).rstrip("\n"),
        "",
    ]
    wall = meta.get("wall_seconds")
    if isinstance(wall, (int, float)):
        lines += [f"Wall time {wall:.0f} s. Raw numbers: `results.csv`, `results.json`.", ""]
    lab_report._write_text(path, "\n".join(lines))


def write_outputs(
    out_dir: Path, state: RunState, meta: dict[str, Any], *, final: bool = True
) -> dict[str, Path]:
    """Write results.json and results.csv, and with ``final`` also longctx.png and report.md
    (each atomically). The run calls it with ``final=False`` after every measurement."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / "results.json",
        "csv": out_dir / "results.csv",
        "png": out_dir / PLOT_FILE,
        "md": out_dir / "report.md",
    }
    data = {"meta": meta, "rows": state.rows, "trials": state.trials}
    lab_report.write_json_file(paths["json"], data)
    write_csv(paths["csv"], state.rows)
    if final:
        trained = meta.get("model", {}).get("max_position_embeddings")
        if state.rows and installed("matplotlib"):
            plot(paths["png"], state.rows, trained)
        else:
            del paths["png"]
        write_markdown(paths["md"], state, meta, plot="png" in paths)
    return paths
