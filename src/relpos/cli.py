"""The ``relpos`` command.

Each subcommand is one entry of ``COMMANDS``: a help line, a function that adds its
arguments, and a function ``run(args) -> exit code``. ``ValueError``/``TypeError`` raised
inside a command (bad names, bad shapes) become one line ``relpos: error: ...`` and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

from . import registry

# ------------------------------------------------------------------------------ list


def encoding_rows(family: str | None = None) -> list[dict[str, str]]:
    """One row per registered encoding: name, family, relative, hooks, paper."""
    classes = {name: registry.encoding_class(name) for name in registry.available()}
    families = sorted({cls.family for cls in classes.values()})
    if family is not None and family not in families:
        raise ValueError(f"unknown family {family!r}; known: {', '.join(families)}")
    rows = []
    for name, cls in classes.items():
        if family is not None and cls.family != family:
            continue
        hooks = [
            hook
            for hook, active in (
                ("rotate", cls.has_rotary),
                ("bias", cls.has_bias),
                ("embed", cls.adds_to_input),
            )
            if active
        ]
        rows.append(
            {
                "name": name,
                "family": cls.family,
                "relative": "yes" if cls.relative else "no",
                "hooks": ", ".join(hooks) or "-",
                "paper": cls.paper or "-",
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


def _list_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--markdown", action="store_true", help="print the README's table")
    parser.add_argument("--family", help="only encodings of this family (e.g. rotary, bias)")


def _list(args: argparse.Namespace) -> int:
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


# ------------------------------------------------------------------------------ demo


def _demo(args: argparse.Namespace) -> int:
    import torch

    import relpos
    from relpos.attention import choose_backend
    from relpos.attention.call import prepare_call

    names = relpos.available()
    print(f"relpos {relpos.__version__}: {len(names)} encodings: {', '.join(names)}")
    print("plan: the `extrapolate` lab (train short, test long) lands with a later issue;")
    print("      for now, a causal forward pass of relpos.attention on random q, k, v:")
    header = ("encoding", "q, k, v (B, H, L, D)", "out", "auto picks")
    print("  {:<9} {:<22} {:<22} {:<11} |auto - eager|".format(*header))
    torch.manual_seed(0)
    heads, head_dim = 4, 32
    for name, length in (("alibi", 128), ("rope", 128), ("alibi", 2048)):
        enc = relpos.create(name, num_heads=heads, head_dim=head_dim)
        q, k, v = (torch.randn(1, heads, length, head_dim) for _ in range(3))
        call = prepare_call(
            q, k, v, enc, q_pos=None, k_pos=None, causal=True, mask=None, scale=None
        )
        backend = choose_backend(call)
        out = relpos.attention(q, k, v, enc, causal=True)
        ref = relpos.attention(q, k, v, enc, causal=True, backend="eager")
        err = (out - ref).abs().max().item()
        shape_in, shape_out = str(tuple(q.shape)), str(tuple(out.shape))
        print(f"  {name:<9} {shape_in:<22} {shape_out:<22} {backend:<11} {err:.1e}")
    return 0


# ------------------------------------------------------------------------------ main


class Command(NamedTuple):
    help: str
    add_args: Callable[[argparse.ArgumentParser], None] | None
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {
    "list": Command("list the registered encodings", _list_args, _list),
    "demo": Command("run a tiny forward pass with alibi and rope", None, _demo),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relpos", description="Relative positional encodings: list, demo, and the lab."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.help, description=cmd.help)
        if cmd.add_args is not None:
            cmd.add_args(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``relpos ARGS``; returns the exit code (argparse exits 2 on bad usage)."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command].run(args)
    except (ValueError, TypeError) as err:
        message = " ".join(str(err).split())
        print(f"relpos: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
