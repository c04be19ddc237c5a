"""``relpos demo`` (``make demo``): the quick ``relpos extrapolate`` run into ``runs/demo``, or
with ``--attention-only`` a few seconds of ``relpos.attention`` on random q, k, v (which
backend ``auto`` picks, and how far it is from ``eager``)."""

from __future__ import annotations

import argparse

__all__ = ["add_arguments", "run_command", "attention_demo"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``relpos demo``."""
    parser.add_argument(
        "--attention-only",
        action="store_true",
        help="only the quick forward pass of relpos.attention (seconds), no training",
    )
    parser.add_argument("--out", default="runs/demo", help="run folder (default runs/demo)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted demo in --out (by default the demo starts afresh)",
    )


def attention_demo() -> int:
    """A causal forward pass per (encoding, length): shapes, ``auto``'s pick, |auto - eager|."""
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
    for name, length in (("alibi", 128), ("rope", 128), ("t5", 128), ("t5", 2048)):
        enc = relpos.create(name, num_heads=heads, head_dim=head_dim)
        q, k, v = (torch.randn(1, heads, length, head_dim) for _ in range(3))
        backend, _ = plan(q, k, v, enc, causal=True)
        out = relpos.attention(q, k, v, enc, causal=True)
        ref = relpos.attention(q, k, v, enc, causal=True, backend="eager")
        err = (out - ref).abs().max().item()
        shape_in, shape_out = str(tuple(q.shape)), str(tuple(out.shape))
        print(f"  {name:<9} {shape_in:<22} {shape_out:<22} {backend:<11} {err:.1e}")
    return 0


def run_command(args: argparse.Namespace) -> int:
    """``relpos demo``: ``--attention-only``, or ``relpos extrapolate --out OUT --force``
    (``--resume``: ``relpos extrapolate --out OUT --resume``, what the interrupt hint says)."""
    if args.attention_only:
        if args.resume:
            raise ValueError("--resume continues the training demo; --attention-only has none")
        return attention_demo()
    from .extrapolate import command

    parser = argparse.ArgumentParser(prog="relpos extrapolate")
    command.add_arguments(parser)
    ns = parser.parse_args(["--out", args.out, "--resume" if args.resume else "--force"])
    ns.argv = getattr(args, "argv", ["demo"])
    return command.run_command(ns)
