"""The ``relpos`` command: a table of subcommands, each living with its module.

``COMMANDS`` maps a subcommand to a help line and the module that implements it; every such
module defines ``add_arguments(parser)`` and ``run_command(args) -> exit code`` (imported
only when the command line is parsed). ``ValueError``/``TypeError`` raised inside a command
(bad names, bad flags, corrupt run folders) become one line ``relpos: error: ...`` and exit
2; a command stopped by a signal exits ``128 + signal`` (130 Ctrl-C, 143 SIGTERM).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

from relpos.optional import OptionalDependencyError

from .listing import LIST_HEAD_DIM, LIST_HEADS, encoding_rows, markdown_table

__all__ = [
    "COMMANDS",
    "Command",
    "build_parser",
    "main",
    "encoding_rows",
    "markdown_table",
    "LIST_HEADS",
    "LIST_HEAD_DIM",
]


class Command(NamedTuple):
    """One subcommand: its help line, and its module's ``add_arguments`` / ``run_command``."""

    help: str
    add_args: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def command(help: str, module: str) -> Command:
    """The ``Command`` of ``module`` (imported when first used)."""

    def add_args(parser: argparse.ArgumentParser) -> None:
        importlib.import_module(module).add_arguments(parser)

    def run(args: argparse.Namespace) -> int:
        return importlib.import_module(module).run_command(args)

    return Command(help, add_args, run)


COMMANDS: dict[str, Command] = {
    "list": command("list the registered encodings", "relpos_lab.listing"),
    "demo": command(
        "train short, test long: the quick `extrapolate` run into runs/demo", "relpos_lab.demo"
    ),
    "extrapolate": command(
        "train each encoding at length L, measure perplexity at L..16L, write a report",
        "relpos_lab.extrapolate.command",
    ),
    "longctx": command(
        "training-free context extension of pretrained SmolLM2: passkey and perplexity vs "
        "length per RoPE scaling method",
        "relpos_lab.longctx.command",
    ),
    "tasks": command(
        "algorithmic length generalisation: Chomsky, NoPE-study and coupling suites, "
        "accuracy per test length over seeds",
        "relpos_lab.tasks.command",
    ),
    "bench": command(
        "time and peak memory of encodings x backends x lengths beside no-bias SDPA "
        "(ratios, JSON/CSV, log-log plots)",
        "relpos_lab.bench",
    ),
    "analyze": command(
        "diagnostics: RoPE decay bound, base lower bound, attention resolution, wavelengths",
        "relpos_lab.analysis.command",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relpos", description="Relative positional encodings: list, demo, and the lab."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, cmd in COMMANDS.items():
        cmd.add_args(sub.add_parser(name, help=cmd.help, description=cmd.help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``relpos ARGS``; returns the exit code (argparse exits 2 on bad usage)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        code = COMMANDS[args.command].run(args)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except (ValueError, TypeError, OptionalDependencyError) as err:
        message = " ".join(str(err).split())
        print(f"relpos: error: {message}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _closed_pipe()
    except OSError as err:
        # a file system refusal after the checks (disk full, a folder removed meanwhile):
        # one line naming the file, not a traceback
        print(f"relpos: error: {err}", file=sys.stderr)
        return 1


def _closed_pipe() -> int:
    """The reader stopped (``relpos list | head -1``): what it read is the answer, not an
    error; stdout goes to devnull so the interpreter's final flush cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
