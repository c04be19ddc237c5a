"""``relpos analyze MODE``: diagnostics of positional encodings, as a PNG, a JSON and a table.

Modes:

* ``decay``: RoFormer's long-term-decay bound and expected scores vs distance, any encoding;
* ``base-bound``: the smallest RoPE base for a context length (Men et al. 2024);
* ``resolution``: attention resolution (Sun et al. 2022) of encodings at several lengths;
* ``frequencies``: RoPE wavelengths per pair under frequency scalings;
* ``receptive-field``, ``positional-heads``, ``influence``, ``causal-mask``, ``kv-phase``:
  the diagnostics of ``analysis/diagnostic_modes.py`` (encodings or ``--model``).

Every argument is parsed and checked (encodings created, scaling dicts validated, ``--out``
creatable) before anything is computed or written; numbers are parsed with
``relpos_lab.arguments``, not by argparse, so a bad value is one ``relpos: error: ...`` line
(exit 2) naming the flag. Files are written atomically into ``--out``; without matplotlib
everything but the PNG is written, and the command says so.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from ..arguments import parse_float, parse_int, parse_int_list
from .diagnostic_modes import MODES as DIAGNOSTIC_MODES
from .diagnostic_modes import RUN as DIAGNOSTIC_RUN
from .diagnostic_modes import add_modes as add_diagnostic_modes
from .reporting import output_dir, parse_encodings, print_table, write_outputs

__all__ = ["add_arguments", "run_command"]

MODES = ("decay", "base-bound", "resolution", "frequencies", *DIAGNOSTIC_MODES)


# ------------------------------------------------------------------------------ parsing


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    """``--samples``, ``--key-correlation`` and ``--seed`` of the Monte-Carlo modes (checked in
    that order), as the keyword arguments ``decay_curves`` and ``encoding_resolution`` take."""
    return {
        "samples": parse_int(args.samples, "--samples"),
        "key_correlation": parse_float(
            args.key_correlation, "--key-correlation", minimum=-1.0, maximum=1.0
        ),
        "seed": parse_int(args.seed, "--seed", minimum=0),
    }


def _scaling(value: str) -> dict[str, Any]:
    try:
        scaling = json.loads(value)
    except json.JSONDecodeError as err:
        raise ValueError(f"--scaling must be a JSON object, got {value!r} ({err.msg})") from None
    if not isinstance(scaling, dict):
        raise ValueError(
            f"--scaling must be a JSON object (an HF rope_scaling dict), got {value!r}"
        )
    return scaling


def _g(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


# ------------------------------------------------------------------------------ modes


def _decay(args: argparse.Namespace) -> int:
    from .decay import decay_curves, plot_decay

    head_dim = parse_int(args.head_dim, "--head-dim", minimum=2)
    num_heads = parse_int(args.num_heads, "--num-heads")
    max_distance = parse_int(args.max_distance, "--max-distance")
    sampling = _sampling(args)
    out = output_dir(args.out)
    encodings = parse_encodings(args.encodings, num_heads, head_dim)

    curves = [decay_curves(enc, max_distance, **sampling) for enc in encodings]
    write_outputs(
        out,
        "decay",
        args,
        {"curves": [c.to_dict() for c in curves]},
        lambda path: plot_decay(curves, path),
    )
    quarter = max(1, (max_distance + 1) // 4)
    rows = []
    for c in curves:
        tail = None if c.bound is None else sum(c.bound[-quarter:]) / quarter
        e0 = c.expected_score[0] or 1.0
        rows.append(
            [
                c.encoding,
                str(c.rotated_pairs),
                _g(c.bound[0] if c.bound else None),
                _g(c.bound[min(64, max_distance)] if c.bound else None),
                _g(tail),
                _g(c.expected_score[-1] / e0, 3),
            ]
        )
    print_table(
        f"long-term decay, head_dim {head_dim}, distances 0..{max_distance}",
        ["encoding", "pairs", "bound@0", f"bound@{min(64, max_distance)}", "tail", "E ratio"],
        rows,
        caption=(
            "pairs: rotated channel pairs; tail: mean bound over the last quarter; "
            f"E ratio: expected score at {max_distance} / at 0"
        ),
    )
    for c in curves:
        if c.note:
            print(f"{c.encoding}: {c.note}")
    return 0


def _base_bound(args: argparse.Namespace) -> int:
    from .base_bound import plot_base_bound, rope_base_lower_bound

    contexts = parse_int_list(args.context, "--context")
    head_dim = parse_int(args.head_dim, "--head-dim", minimum=2)
    if head_dim % 2:
        raise ValueError(f"--head-dim must be even, got {head_dim}")
    grid_points = parse_int(args.grid_points, "--grid-points", minimum=2)
    out = output_dir(args.out)

    bounds = [
        rope_base_lower_bound(c, head_dim, grid_points=grid_points) for c in sorted(set(contexts))
    ]
    write_outputs(
        out,
        "base_bound",
        args,
        {"bounds": [b.to_dict() for b in bounds]},
        lambda path: plot_base_bound(bounds, path),
    )
    print_table(
        f"RoPE base lower bound (Men et al. 2024), head_dim {head_dim}",
        ["context", "lower bound", "fit 0.0424 L^1.628", "bound / fit", "min B_m at bound"],
        [
            [
                f"{b.context:,}",
                f"{b.base:,.1f}",
                f"{b.fit:,.1f}",
                f"{b.base / b.fit:.3f}",
                f"{b.min_advantage:.3g}",
            ]
            for b in bounds
        ],
    )
    return 0


def _resolution(args: argparse.Namespace) -> int:
    from .resolution import encoding_resolution, plot_resolution

    head_dim = parse_int(args.head_dim, "--head-dim", minimum=2)
    num_heads = parse_int(args.num_heads, "--num-heads")
    lengths = sorted(set(parse_int_list(args.lengths, "--lengths", minimum=2)))
    sampling = _sampling(args)
    out = output_dir(args.out)
    encodings = parse_encodings(args.encodings, num_heads, head_dim)

    results = [encoding_resolution(enc, lengths, **sampling) for enc in encodings]
    write_outputs(
        out,
        "resolution",
        args,
        {"results": [r.to_dict() for r in results]},
        lambda path: plot_resolution(results, path),
    )
    print_table(
        f"attention resolution R(s) (Sun et al. 2022), head_dim {head_dim}",
        ["encoding", *(f"L={n}" for n in lengths)],
        [[r.encoding, *(f"{v:.4g}" for v in r.resolution)] for r in results],
    )
    return 0


def _frequencies(args: argparse.Namespace) -> int:
    from .frequencies import default_profiles, plot_wavelengths

    head_dim = parse_int(args.head_dim, "--head-dim", minimum=2)
    base = parse_float(args.base, "--base", above=1.0)
    factor = parse_float(args.factor, "--factor", minimum=1.0)
    original = parse_int(args.original, "--original")
    out = output_dir(args.out)
    scalings = [_scaling(s) for s in args.scaling] if args.scaling else None

    profiles = default_profiles(head_dim, base, factor, original, scalings)
    target = max((p.seq_len for p in profiles if p.seq_len), default=None)
    write_outputs(
        out,
        "frequencies",
        args,
        {"profiles": [p.to_dict() for p in profiles]},
        lambda path: plot_wavelengths(profiles, path, original=original, target=target),
    )
    rows = []
    for p in profiles:
        finite = [w for w in p.wavelength if w != float("inf")]
        rows.append(
            [
                p.label,
                f"{p.attention_factor:.4g}",
                _g(min(finite) if finite else None),
                _g(max(finite) if finite else None),
                str(len(p.wavelength) - len(finite)),
                str(sum(w > original for w in p.wavelength)),
            ]
        )
    print_table(
        f"RoPE wavelengths (tokens), head_dim {head_dim}, base {base:g}",
        [
            "scaling",
            "attention factor",
            "shortest",
            "longest",
            "zero freq.",
            f"pairs longer than {original}",
        ],
        rows,
    )
    return 0


_RUN: dict[str, Callable[[argparse.Namespace], int]] = {
    "decay": _decay,
    "base-bound": _base_bound,
    "resolution": _resolution,
    "frequencies": _frequencies,
    **DIAGNOSTIC_RUN,
}


# ------------------------------------------------------------------------------ arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``analyze`` sub-modes and their options (numbers stay strings: see module doc)."""
    sub = parser.add_subparsers(dest="mode", metavar="MODE", required=True)

    def mode(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("--out", default="runs/analyze", help="folder (default runs/analyze)")
        return p

    def model_args(p: argparse.ArgumentParser, encodings: str) -> None:
        p.add_argument("--encodings", default=encodings, help=f"registry names ({encodings})")
        p.add_argument("--head-dim", default="128", help="channels per head (128)")
        p.add_argument("--num-heads", default="1", help="heads; curves average them (1)")
        p.add_argument("--samples", default="256", help="random (q, k) draws (256)")
        p.add_argument(
            "--key-correlation",
            default="1.0",
            help="rho of k = rho q + sqrt(1 - rho^2) w (1: similar key)",
        )
        p.add_argument("--seed", default="0", help="seed of the random draws (0)")

    p = mode("decay", "RoFormer long-term-decay bound and expected scores vs distance")
    model_args(p, "rope,xpos")
    p.add_argument("--max-distance", default="4096", help="largest distance (4096)")

    p = mode("base-bound", "smallest RoPE base for a context length (Men et al. 2024)")
    p.add_argument("--context", default="1024,4096,32768", help="context lengths, comma-separated")
    p.add_argument("--head-dim", default="128", help="rotary dimension d (128)")
    p.add_argument("--grid-points", default="1500", help="log-grid points over 0.2..3 x fit")

    p = mode("resolution", "attention resolution (xPos paper) vs length")
    model_args(p, "rope,xpos,alibi,nope")
    p.add_argument("--lengths", default="512,1024,2048,4096", help="lengths, comma-separated")

    p = mode("frequencies", "RoPE wavelength per pair under frequency scalings")
    p.add_argument(
        "--scaling",
        action="append",
        help="an HF rope_scaling dict as JSON (repeatable; default: one per type)",
    )
    p.add_argument("--head-dim", default="128", help="channels per head (128)")
    p.add_argument("--base", default="10000", help="rope_theta (10000)")
    p.add_argument("--factor", default="4", help="factor of the default presets (4)")
    p.add_argument("--original", default="2048", help="original context length (2048)")

    add_diagnostic_modes(mode)


def run_command(args: argparse.Namespace) -> int:
    """Run ``relpos analyze MODE``; returns the exit code."""
    return _RUN[args.mode](args)
