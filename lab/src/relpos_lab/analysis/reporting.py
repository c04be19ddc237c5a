"""How a ``relpos analyze`` mode reports: ``--encodings`` parsed into encodings, the output
folder checked, the terminal table (rich, or aligned plain text) and the JSON + PNG files
(written atomically, with the exact command in the JSON's ``meta``)."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from relpos.optional import missing_plot_note

from ..arguments import parse_names
from ..io import check_output_dir
from ..terminal import Table
from ..terminal import print_table as print_table_text

__all__ = ["output_dir", "parse_encodings", "print_table", "write_outputs"]


def parse_encodings(value: str, num_heads: int, head_dim: int) -> list[Any]:
    import relpos

    names = [v.strip() for v in value.split(",")]
    if len(set(names)) != len(names):
        raise ValueError(f"--encodings lists a name twice: {value!r}")
    names = parse_names(value, "--encodings")
    out = []
    for name in names:
        relpos.registry.encoding_class(name)  # unknown name -> ValueError listing the known ones
        out.append(relpos.create(name, num_heads=num_heads, head_dim=head_dim))
    return out


def output_dir(value: str) -> Path:
    return check_output_dir(value, "--out")


# ------------------------------------------------------------------------------ output


def print_table(
    title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], caption: str = ""
) -> None:
    """A mode's table in the terminal (``relpos_lab.terminal``); numbers right-aligned."""
    table = Table(title, columns, rows, caption, right=frozenset(range(1, len(columns))))
    print_table_text(table)


def write_outputs(
    out: Path, stem: str, args: argparse.Namespace, payload: dict[str, Any], plot
) -> None:
    from relpos import __version__

    from ..io import write_json

    out.mkdir(parents=True, exist_ok=True)
    argv = getattr(args, "argv", None)
    meta = {
        "command": "relpos " + (shlex.join(argv) if argv else f"analyze {args.mode}"),
        "relpos_version": __version__,
    }
    note = missing_plot_note(f"{stem}.png")
    if note is None:
        plot(out / f"{stem}.png")
    write_json(out / f"{stem}.json", {"meta": meta, **payload})
    if note is None:
        print(f"wrote {out / (stem + '.png')} and {out / (stem + '.json')}")
    else:
        print(f"wrote {out / (stem + '.json')}; {note}")
