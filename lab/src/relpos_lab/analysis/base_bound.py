"""RoPE base lower bound for a context length (Men et al. 2024, "Base of RoPE Bounds Context
Length", arXiv 2405.14591; the definition read in the paper, no code).

For head dimension ``d`` and base ``b`` let

    B_m(b) = sum_{i=0}^{d/2-1} cos(m * b^(-2i/d))

(up to a positive constant, the expected advantage of a similar key over a random key at
distance ``m``). A base *can* serve context ``L`` when ``B_m(b) >= 0`` for every integer
``m`` in ``[0, L]``; the lower bound ``b_L`` is the smallest such base. The paper fits
``b_L ~ 0.0424 * L^1.628``.

Feasibility is not monotonic in ``b`` (narrow feasible windows lie below wide infeasible
ranges), so a bisection or a coarse grid is wrong. The bound
is the first feasible base on a fine log grid: ``grid_points`` (1500) bases spaced evenly in
log over ``span`` (0.2 .. 3) times the fit, a step of about 0.18 %. Every grid point is checked
exactly (all ``m`` in ``[0, L]``, float64; numpy, whose small single-threaded kernels are
much faster here than torch's on a busy machine).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from relpos.validation import check_float, check_int

from ..io import save_figure

__all__ = [
    "FIT_COEFFICIENT",
    "FIT_EXPONENT",
    "BaseBound",
    "base_bound_fit",
    "similarity_advantage",
    "min_similarity_advantage",
    "is_feasible",
    "rope_base_lower_bound",
    "plot_base_bound",
]

FIT_COEFFICIENT = 0.0424
FIT_EXPONENT = 1.628

# Distances per evaluation block: (block, d/2) float64 cosines, 0.5 MB at d = 128.
_BLOCK = 1024
# Windows around the previous grid point's witness, checked first (narrowest first).
_HINTS = (16, 128, 1024)


def _check_base(base: object) -> float:
    return check_float(base, "base", above=1.0)


def _check_head_dim(head_dim: object) -> int:
    head_dim = check_int(head_dim, "head_dim", minimum=2)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    return head_dim


def _theta(base: float, head_dim: int) -> np.ndarray:
    return base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def base_bound_fit(context: int) -> float:
    """The paper's power-law fit ``0.0424 * L^1.628`` of the bound (an approximation)."""
    context = check_int(context, "context")
    return FIT_COEFFICIENT * context**FIT_EXPONENT


def similarity_advantage(base: float, distances: Tensor, head_dim: int = 128) -> Tensor:
    """``B_m(b) = sum_i cos(m * b^(-2i/d))`` in float64 for each distance ``m``: ``(..., )``."""
    base = _check_base(base)
    head_dim = _check_head_dim(head_dim)
    if not isinstance(distances, Tensor):
        raise TypeError(f"distances must be a torch.Tensor, got {type(distances).__name__}")
    m = distances.to(torch.float64)
    return torch.cos(m[..., None] * torch.from_numpy(_theta(base, head_dim))).sum(-1)


def _scan(
    base: float, context: int, head_dim: int, stop_at_negative: bool, hint: int | None = None
) -> tuple[float, int]:
    """``(min_m B_m, argmin)`` over ``m = 0..context``; with ``stop_at_negative`` the scan ends
    at the first block holding a negative value (its minimum is then returned).

    Blocks are visited from the largest distances down, after a block around ``hint`` (the
    witness of the previous grid point): near the bound the negative values lie close to
    ``context`` and move little from one grid point to the next.
    """
    theta = _theta(base, head_dim)
    blocks = [(s, min(context + 1, s + _BLOCK)) for s in range(0, context + 1, _BLOCK)][::-1]
    if hint is not None and stop_at_negative:
        for width in _HINTS[::-1]:
            blocks.insert(0, (max(hint - width, 0), min(hint + width + 1, context + 1)))
    best, where = math.inf, 0
    for start, end in blocks:
        m = np.arange(start, end, dtype=np.float64)
        values = np.cos(np.multiply.outer(m, theta)).sum(-1)
        i = int(values.argmin())
        if float(values[i]) < best:
            best, where = float(values[i]), start + i
        if stop_at_negative and best < 0:
            break
    return best, where


def min_similarity_advantage(base: float, context: int, head_dim: int = 128) -> float:
    """``min_{0 <= m <= context} B_m(b)`` (exact, float64)."""
    base = _check_base(base)
    head_dim = _check_head_dim(head_dim)
    context = check_int(context, "context")
    return _scan(base, context, head_dim, stop_at_negative=False)[0]


def is_feasible(base: float, context: int, head_dim: int = 128) -> bool:
    """Whether ``B_m(base) >= 0`` for every integer ``m`` in ``[0, context]``."""
    base = _check_base(base)
    head_dim = _check_head_dim(head_dim)
    context = check_int(context, "context")
    return _scan(base, context, head_dim, stop_at_negative=True)[0] >= 0


@dataclass(frozen=True)
class BaseBound:
    """The lower bound of the RoPE base for one context length.

    ``base`` is the first feasible base of the grid; ``fit`` the paper's power law;
    ``min_advantage`` = ``min_m B_m(base)`` (>= 0); ``below`` the grid point just under
    ``base`` (``None`` if ``base`` is the first grid point) and ``below_witness`` a distance
    ``m <= context`` where ``B_m(below) < 0`` (the proof that ``below`` is infeasible).
    """

    context: int
    head_dim: int
    base: float
    fit: float
    min_advantage: float
    below: float | None
    below_witness: int | None
    grid_points: int
    span: tuple[float, float]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rope_base_lower_bound(
    context: int,
    head_dim: int = 128,
    *,
    grid_points: int = 1500,
    span: tuple[float, float] = (0.2, 3.0),
) -> BaseBound:
    """Smallest RoPE base that keeps ``B_m(b) >= 0`` for all ``m <= context`` (Men et al. 2024).

    Bases are tried in increasing order on a log grid of ``grid_points`` over ``span`` times
    the fit ``0.0424 * context^1.628``; the first feasible one is returned. Raises
    ``ValueError`` if no grid point is feasible (widen ``span``).

    Reference values (d = 128, as the paper's table): 4299.0 at 1024, 26959.3 at 4096,
    630561.5 at 32768.
    """
    context = check_int(context, "context")
    head_dim = _check_head_dim(head_dim)
    grid_points = check_int(grid_points, "grid_points", minimum=2)
    if (
        not isinstance(span, (tuple, list))
        or len(span) != 2
        or not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in span)
        or not 0 < span[0] < span[1]
    ):
        raise ValueError(f"span must be (low, high) with 0 < low < high, got {span!r}")
    fit = base_bound_fit(context)
    if span[0] * fit <= 1.0:
        raise ValueError(
            f"span[0] * fit = {span[0] * fit:g} must be > 1 (a RoPE base); raise span[0]"
        )
    grid = np.logspace(math.log10(span[0] * fit), math.log10(span[1] * fit), grid_points).tolist()
    below = witness = None
    for base in grid:
        value, where = _scan(base, context, head_dim, stop_at_negative=True, hint=witness)
        if value >= 0:
            return BaseBound(
                context=context,
                head_dim=head_dim,
                base=base,
                fit=fit,
                min_advantage=value,
                below=below,
                below_witness=witness,
                grid_points=grid_points,
                span=(float(span[0]), float(span[1])),
            )
        below, witness = base, where
    raise ValueError(
        f"no feasible base for context {context} on the grid {span[0]:g}..{span[1]:g} x fit "
        f"({span[0] * fit:.4g}..{span[1] * fit:.4g}); widen span"
    )


def plot_base_bound(bounds: list[BaseBound], path: str | Path) -> None:
    """Bound vs context length (log-log) with the paper's fit; written atomically as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not bounds:
        raise ValueError("bounds must not be empty")
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    contexts = [b.context for b in bounds]
    lo, hi = min(contexts), max(contexts)
    xs = torch.logspace(math.log10(lo / 1.5), math.log10(hi * 1.5), 100).tolist()
    ax.plot(
        xs,
        [FIT_COEFFICIENT * x**FIT_EXPONENT for x in xs],
        color="0.5",
        linestyle="--",
        label=f"fit {FIT_COEFFICIENT} L^{FIT_EXPONENT}",
    )
    ax.plot(
        contexts,
        [b.base for b in bounds],
        "o",
        color="tab:blue",
        label=f"lower bound (d={bounds[0].head_dim})",
    )
    for b in bounds:
        ax.annotate(
            f"{b.base:.4g}",
            (b.context, b.base),
            textcoords="offset points",
            xytext=(4, -10),
            fontsize=8,
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length L")
    ax.set_ylabel("smallest RoPE base b with B_m(b) >= 0 for m <= L")
    ax.set_title("RoPE base lower bound (Men et al. 2024)", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    save_figure(fig, path)
