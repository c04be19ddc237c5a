"""``DistanceBias``: the base of additive biases that depend on ``q_pos - k_pos`` only.

A subclass writes ``bias_at_distance(h, distance) -> bias`` once, as the paper's formula;
the base ``Encoding.bias`` reads ``distance = q_pos[b, i] - k_pos[b, j]`` (``>= 0`` for keys
in the past) and backends broadcast it over full grids, tiles, per-distance tables
(``distance_table``, the chunked backend's Toeplitz path) or call it as a FlexAttention
``score_mod``. Biases are added after the ``1/sqrt(d)`` scaling.

The encodings of this family, one per module: ``alibi`` (ALiBi), ``t5`` (T5 buckets),
``kerple`` (KERPLE log / power), ``fire`` (FIRE), ``tabulated`` (``TabulatedDistanceBias``,
the per-call table of costly formulas), ``sandwich`` (Sandwich), ``dynamic_position_bias``.

Two small helpers shared with other families live here too: ``distance_range`` (the
reachable ``q_pos - k_pos`` of a call) and ``accurate_dtype`` (float64 where the device has
it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..base import BiasContext, Encoding

__all__ = ["DistanceBias", "LinearPiece", "distance_range", "accurate_dtype"]


@dataclass(frozen=True)
class LinearPiece:
    """One linear piece of a piecewise-linear distance bias: ``b_h(d) = slope_h * (d - gamma)``
    for distances ``low <= d <= high`` (``None``: unbounded), ``slope (H,)``.

    A bias made of such pieces folds exactly into extra q/k channels (``relpos.attention.fold``:
    ``slope_h * d`` is ``slope_h * q_pos`` minus ``slope_h * k_pos``, a row term the softmax
    ignores plus a rank-1 term), one fused-kernel pass per piece."""

    slope: Tensor
    gamma: float = 0.0
    low: int | None = None
    high: int | None = None


class DistanceBias(Encoding):
    """Base of biases ``b_h(i, j) = f_h(q_pos_i - k_pos_j)``: ``relative`` and
    ``distance_only`` by construction; subclasses give ``bias_at_distance(h (..), distance
    (..)) -> (..)`` (index tensors that broadcast, 0-d inside FlexAttention)."""

    has_bias = True
    relative = True
    distance_only = True

    def linear_pieces(self) -> list[LinearPiece] | None:
        """The bias as linear pieces of the distance (``LinearPiece``), when it is exactly
        piecewise linear with fixed breakpoints (ALiBi); None otherwise (the default)."""
        return None


def distance_range(ctx: BiasContext) -> tuple[int, int] | None:
    """Smallest and largest ``q_pos - k_pos`` of the call (integer positions), else None.

    ``ctx.q_pos (B, Lq)``, ``ctx.k_pos (B, Lk)``. One host sync. This is the call's position fact
    that the engine is to provide once per call; until it does, every encoding that needs the
    reachable distances (tabulated biases, URPE's table bounds) asks this one helper.
    """
    if ctx.q_pos.is_floating_point() or ctx.q_pos.numel() == 0 or ctx.k_pos.numel() == 0:
        return None
    low = ctx.q_pos.amin(1) - ctx.k_pos.amax(1)
    high = ctx.q_pos.amax(1) - ctx.k_pos.amin(1)
    return int(low.min()), int(high.max())


def accurate_dtype(device: torch.device) -> torch.dtype:
    """float64 where the device has it (per-distance or per-token tables are O(L): exactness
    is cheap), float32 on MPS."""
    return torch.float32 if device.type == "mps" else torch.float64
