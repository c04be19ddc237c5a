"""``relpos list``: the registered encodings with their family, flags and paper;
``relpos list NAME`` one encoding's card (``relpos.describe``: paper and options).

``encoding_rows`` reads each encoding's flags from an instance with default options (the
instance is the truth); ``markdown_table`` is the README's encoding table (``make docs``).
"""

from __future__ import annotations

import argparse

from relpos import registry

from .terminal import Table, print_table

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
    parser.add_argument(
        "name", nargs="?", help="one encoding: its paper and options (relpos.describe)"
    )
    parser.add_argument("--markdown", action="store_true", help="print the README's table")
    parser.add_argument("--family", help="only encodings of this family (e.g. rotary, bias)")


def run_command(args: argparse.Namespace) -> int:
    """``relpos list [NAME]``: one encoding's card, the table (rich on a terminal it fits,
    aligned text otherwise) or the README's markdown."""
    if args.name is not None:
        if args.markdown or args.family:
            raise ValueError("relpos list NAME takes neither --markdown nor --family")
        print(registry.describe(args.name))
        return 0
    if args.markdown:
        print(markdown_table(args.family))
        return 0
    rows = encoding_rows(args.family)
    columns = ("name", "family", "relative", "hooks", "paper")
    table = Table(
        f"relpos encodings ({len(rows)})", columns, [[r[c] for c in columns] for r in rows]
    )
    print_table(table)
    return 0
