"""The ``relpos`` command.

Each subcommand is one entry of ``COMMANDS``: a help line, a function that adds its
arguments, and a function ``run(args) -> exit code``. ``ValueError``/``TypeError`` raised
inside a command (bad names, bad shapes) become one line ``relpos: error: ...`` and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

from . import registry

# ------------------------------------------------------------------------------ list


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


def _attention_demo() -> int:
    import torch

    import relpos
    from relpos.attention import plan

    names = relpos.available()
    print(f"relpos {relpos.__version__}: {len(names)} encodings: {', '.join(names)}")
    print("a causal forward pass of relpos.attention on random q, k, v")
    print("(`relpos demo` without --attention-only runs `relpos extrapolate`):")
    header = ("encoding", "q, k, v (B, H, L, D)", "out", "auto picks")
    print("  {:<9} {:<22} {:<22} {:<11} |auto - eager|".format(*header))
    torch.manual_seed(0)
    heads, head_dim = 4, 32
    for name, length in (("alibi", 128), ("rope", 128), ("alibi", 2048)):
        enc = relpos.create(name, num_heads=heads, head_dim=head_dim)
        q, k, v = (torch.randn(1, heads, length, head_dim) for _ in range(3))
        backend, _ = plan(q, k, v, enc, causal=True)
        out = relpos.attention(q, k, v, enc, causal=True)
        ref = relpos.attention(q, k, v, enc, causal=True, backend="eager")
        err = (out - ref).abs().max().item()
        shape_in, shape_out = str(tuple(q.shape)), str(tuple(out.shape))
        print(f"  {name:<9} {shape_in:<22} {shape_out:<22} {backend:<11} {err:.1e}")
    return 0


def _demo_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--attention-only",
        action="store_true",
        help="only the quick forward pass of relpos.attention (seconds), no training",
    )
    parser.add_argument("--out", default="runs/demo", help="run folder (default runs/demo)")


def _demo(args: argparse.Namespace) -> int:
    if args.attention_only:
        return _attention_demo()
    # The quick extrapolation profile into runs/demo, replacing an earlier demo run.
    ns = build_parser().parse_args(["extrapolate", "--out", args.out, "--force"])
    ns.argv = getattr(args, "argv", ["demo"])
    return _extrapolate(ns)


# ------------------------------------------------------------------------------ extrapolate


def _extrapolate_args(parser: argparse.ArgumentParser) -> None:
    # Numbers are parsed by the command (not argparse types) so bad values give one line.
    add = parser.add_argument
    add("--encodings", help="comma-separated registry names (default: the profile's list)")
    add("--train-len", default="128", help="training length L in tokens (default 128)")
    add("--eval-mult", default="1,2,4,8,16", help="evaluation lengths as multiples of L")
    add("--steps", help="training steps per encoding (default: the profile's)")
    add("--profile", default="quick", help="quick (default, ~6 min on 2 cores) or paper")
    add("--data", help="UTF-8 text file or folder of *.txt (default: built-in Shakespeare)")
    add("--tokenizer", default="bytes", help="bytes (default) or bpe")
    add("--bpe-vocab-size", default="2048", help="vocabulary of --tokenizer bpe")
    add("--split", default="test", help="evaluation split: test (default) or valid")
    add("--seed", default="0", help="seed of the model init and the batches (default 0)")
    add("--out", help="run folder (default runs/extrapolate-PROFILE)")
    add("--resume", action="store_true", help="continue the run in --out")
    add("--force", action="store_true", help="replace the run in --out")
    add("--no-progress", action="store_true", help="no progress bars")


def _int_arg(value: str, flag: str, *, minimum: int = 1) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{flag} must be an integer, got {value!r}") from None
    if number < minimum:
        kind = "positive" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{flag} must be {kind}, got {value!r}")
    return number


def _extrapolate(args: argparse.Namespace) -> int:
    import shlex
    import time
    from pathlib import Path

    from .lab import extrapolate as ex
    from .lab import report
    from .lab.profiles import get_profile

    t0 = time.perf_counter()
    # 1. Everything that needs no data, then the data, then the plan: nothing is written
    #    before all of it has been validated.
    profile = get_profile(args.profile)
    encodings = ex.parse_encodings(args.encodings or list(profile.encodings))
    train_len = _int_arg(args.train_len, "--train-len")
    mults = ex.parse_mults(args.eval_mult)
    steps = None if args.steps is None else _int_arg(args.steps, "--steps")
    seed = _int_arg(args.seed, "--seed", minimum=0)
    bpe_vocab = _int_arg(args.bpe_vocab_size, "--bpe-vocab-size")
    if args.tokenizer not in ("bytes", "bpe"):
        raise ValueError(f"--tokenizer must be bytes or bpe, got {args.tokenizer!r}")
    if args.split not in ("test", "valid"):
        raise ValueError(f"--split must be test or valid, got {args.split!r}")
    out = Path(args.out or f"runs/extrapolate-{profile.name}")
    ex.check_out_dir(out, resume=args.resume, force=args.force)
    if args.data is not None and not Path(args.data).exists():
        raise ValueError(f"--data {args.data}: no such file or folder")

    from .lab.data import load_corpus

    # The split does not follow --seed: every seed is evaluated on the same unseen text.
    corpus = load_corpus(args.data, tokenizer=args.tokenizer, bpe_vocab_size=bpe_vocab)
    plan = ex.plan_extrapolation(
        encodings,
        corpus=corpus,
        out_dir=out,
        train_len=train_len,
        eval_mults=mults,
        profile=profile,
        steps=steps,
        seed=seed,
        resume=args.resume,
        force=args.force,
        split=args.split,
    )

    # 2. The plan.
    argv = getattr(args, "argv", None)
    command = "relpos " + (shlex.join(argv) if argv else "extrapolate")
    lengths = plan.eval_lengths
    budget = ", ".join(f"{m} {n:,}" for m, n in plan.max_tokens.items())
    print(
        f"relpos extrapolate, profile {profile.name}: {len(encodings)} encodings "
        f"({', '.join(encodings)})"
    )
    print(
        f"  model: TransformerLM dim {profile.dim}, depth {profile.depth}, "
        f"{profile.num_heads} heads; {plan.steps} steps x batch {profile.batch_size} x "
        f"L={train_len} on {corpus.name} ({corpus.tokenizer}, {corpus.train.numel():,} "
        "train tokens)"
    )
    print(
        f"  eval: lengths {', '.join(map(str, lengths))} on the {plan.split} split, "
        f"scored tokens per length: {budget}"
    )
    print(
        f"  estimated time: ~{plan.estimate_seconds() / 60:.1f} min on a quiet 2-core CPU "
        f"(this machine: {os.cpu_count()} CPUs); out: {out}"
    )

    # 3. Run.
    meta = report.run_metadata(
        command=command,
        profile=profile.name,
        seed=seed,
        corpus={
            "name": corpus.name,
            "tokenizer": corpus.tokenizer,
            "vocab_size": corpus.vocab_size,
            "documents": corpus.documents,
            "tokens": {s: int(getattr(corpus, s).numel()) for s in ("train", "valid", "test")},
        },
        eval={
            "split": plan.split,
            "lengths": lengths,
            "modes": plan.modes,
            "max_tokens": plan.max_tokens,
            "starts": plan.starts,
        },
    )
    ex.start_run(plan, {"command": command})
    try:
        rows = ex.run_plan(plan, corpus, progress=not args.no_progress)
    except KeyboardInterrupt:
        print(f"relpos: interrupted; continue with: {command} --resume", file=sys.stderr)
        return 130
    meta["wall_seconds"] = time.perf_counter() - t0
    paths = report.write_report(out, rows, meta)
    report.print_table(rows)
    print(f"wall time {meta['wall_seconds']:.0f} s")
    print(f"report: {paths['md']}")
    return 0


# ------------------------------------------------------------------------------ longctx


def _longctx_args(parser: argparse.ArgumentParser) -> None:
    from .lab.longctx import add_arguments

    add_arguments(parser)


def _longctx(args: argparse.Namespace) -> int:
    from .lab.longctx import run_command

    return run_command(args)


# ------------------------------------------------------------------------------ analyze


def _analyze_args(parser: argparse.ArgumentParser) -> None:
    from .analysis.cli import add_args

    add_args(parser)


def _analyze(args: argparse.Namespace) -> int:
    from .analysis.cli import run

    return run(args)


# ------------------------------------------------------------------------------ main


class Command(NamedTuple):
    help: str
    add_args: Callable[[argparse.ArgumentParser], None] | None
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {
    "list": Command("list the registered encodings", _list_args, _list),
    "demo": Command(
        "train short, test long: the quick `extrapolate` run into runs/demo",
        _demo_args,
        _demo,
    ),
    "extrapolate": Command(
        "train each encoding at length L, measure perplexity at L..16L, write a report",
        _extrapolate_args,
        _extrapolate,
    ),
    "longctx": Command(
        "training-free context extension of pretrained SmolLM2: passkey and perplexity vs "
        "length per RoPE scaling method",
        _longctx_args,
        _longctx,
    ),
    "analyze": Command(
        "diagnostics: RoPE decay bound, base lower bound, attention resolution, wavelengths",
        _analyze_args,
        _analyze,
    ),
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
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        return COMMANDS[args.command].run(args)
    except (ValueError, TypeError) as err:
        message = " ".join(str(err).split())
        print(f"relpos: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
