"""``relpos list``: the registered encodings with their family, flags and paper.

``encoding_rows`` reads each encoding's flags from an instance with default options (the
instance is the truth); ``markdown_table`` is the README's encoding table (``make docs``).
"""

from __future__ import annotations

import argparse

from relpos import registry

__all__ = ["LIST_HEADS", "LIST_HEAD_DIM", "encoding_rows", "markdown_table"]

#: the model size at which ``relpos list`` instantiates each encoding (default options)
LIST_HEADS, LIST_HEAD_DIM = 8, 64


def encoding_rows(family: str | None = None) -> list[dict[str, str]]:
    """One row per registered encoding: name, family, relative, hooks, paper.

    Flags are read from an instance with default options (``LIST_HEADS`` heads of
    ``LIST_HEAD_DIM`` channels): the instance is the truth, options can change flags."""
    encodings = {
        name: registry.create(name, num_heads=LIST_HEADS, head_dim=LIST_HEAD_DIM)
        for name in registry.available()
    }
    families = sorted({enc.family for enc in encodings.values()})
    if family is not None and family not in families:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(families)}")
    rows = []
    for name, enc in encodings.items():
        if family is not None and enc.family != family:
            continue
        hooks = [
            hook
            for hook, active in (
                ("rotate", enc.has_rotary),
                ("pieces", enc.piecewise),
                ("bias", enc.has_bias),
                ("row", enc.row_dependent),
                ("value", enc.has_value_term),
                ("weights", enc.multiplies_probs),
                ("embed", enc.adds_to_input),
                ("inputs", bool(enc.required_inputs or enc.needs_inputs)),
            )
            if active
        ]
        rows.append(
            {
                "name": name,
                "family": enc.family,
                "relative": "yes" if enc.relative else "no",
                "hooks": ", ".join(hooks) or "-",
                "paper": enc.paper or "-",
            }
        )
    return rows


def markdown_table(family: str | None = None) -> str:
    """The encoding table of README.md (``relpos list --markdown``), without a final newline."""
    rows = encoding_rows(family)
    columns = ["name", "family", "relative", "hooks", "paper"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [row[c].replace("|", "\\|") for c in columns]
        cells[0] = f"`{cells[0]}`"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``relpos list``."""
    parser.add_argument("--markdown", action="store_true", help="print the README's table")
    parser.add_argument("--family", help="only encodings of this family (e.g. rotary, bias)")


def run_command(args: argparse.Namespace) -> int:
    """``relpos list``: a rich table (plain text without rich) or the README's markdown."""
    if args.markdown:
        print(markdown_table(args.family))
        return 0
    rows = encoding_rows(args.family)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        width = max(len(r["name"]) for r in rows) if rows else 4
        for r in rows:
            print(f"{r['name']:<{width}}  {r['family']:<8}  {r['relative']:<3}  {r['paper']}")
        return 0
    table = Table(title=f"relpos encodings ({len(rows)})")
    for column in ("name", "family", "relative", "hooks", "paper"):
        table.add_column(column, no_wrap=column != "paper")
    for r in rows:
        table.add_row(r["name"], r["family"], r["relative"], r["hooks"], r["paper"])
    Console().print(table)
    return 0
