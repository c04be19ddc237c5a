"""Tables the commands print: a rich table on a terminal wide enough to show it whole, plain
aligned text everywhere else (a pipe, a file, a narrow terminal, no rich), never a cut cell.

``Table(title, columns, rows, caption, right)`` holds the cells as strings; a cell may carry
rich markup (``"[green]0.98x[/]"``), which plain text drops. ``print_table(table, file)``
chooses the form: rich only when ``file`` is a terminal, rich is installed, and the whole table
fits the terminal's width; otherwise ``plain_text(table)``, columns padded to their widest cell
(numbers right-aligned), so ``relpos list | cut``, ``| column -t`` and logs read as they print.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

__all__ = ["Table", "plain_text", "print_table", "strip_markup"]

_MARKUP = re.compile(r"\[/?[a-z0-9 #,._-]*\]")


def strip_markup(cell: str) -> str:
    """``cell`` without rich's ``[style]...[/]`` tags."""
    return _MARKUP.sub("", cell)


@dataclass
class Table:
    """A table of strings. ``right``: the indices of right-aligned columns (numbers)."""

    title: str
    columns: Sequence[str]
    rows: Sequence[Sequence[str]]
    caption: str = ""
    right: frozenset[int] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(
                    f"a row of table {self.title!r} has {len(row)} cells, expected "
                    f"{len(self.columns)} ({', '.join(self.columns)})"
                )


def plain_text(table: Table) -> str:
    """The table as aligned plain text: title, header, one line per row, caption."""
    header = [c.replace("\n", " ") for c in table.columns]
    body = [[strip_markup(c).replace("\n", " ") for c in row] for row in table.rows]
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        padded = [
            c.rjust(w) if i in table.right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(padded).rstrip()

    lines = [table.title] if table.title else []
    lines += [line(header), line(["-" * w for w in widths]), *(line(r) for r in body)]
    if table.caption:
        lines.append(table.caption)
    return "\n".join(lines)


def _rich_table(table: Table) -> Any:
    from rich.table import Table as RichTable

    out = RichTable(title=table.title or None, caption=table.caption or None)
    for i, column in enumerate(table.columns):
        out.add_column(column, justify="right" if i in table.right else "left", no_wrap=True)
    for row in table.rows:
        out.add_row(*row)
    return out


def print_table(table: Table, file: IO[str] | None = None) -> None:
    """Print ``table`` to ``file`` (stdout): rich on a terminal it fits, else plain text."""
    out = sys.stdout if file is None else file
    if _is_terminal(out):
        try:
            from rich.console import Console
        except ImportError:
            pass
        else:
            from rich.measure import Measurement

            console = Console(file=out)
            rich_table = _rich_table(table)
            unbounded = console.options.update_width(1_000_000)  # the table's natural width
            if Measurement.get(console, unbounded, rich_table).maximum <= console.width:
                console.print(rich_table)
                return
    print(plain_text(table), file=out)


def _is_terminal(file: IO[str]) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):
        return False
