"""``TabulatedDistanceBias``: a distance-only bias evaluated once per distinct distance.

For biases whose per-distance formula is costly (Sandwich's sum of ``d/2`` cosines, the MLP
of ``dynamic-position-bias``), each call evaluates the formula once per integer distance in
the call's range ``[low, high]`` and every backend gathers from that table: the chunked
backend's Toeplitz path stays O(L), the dense SDPA bias is one gather, and FlexAttention
gets a pointwise ``score_mod`` (``table[h, distance - low]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from ..base import BiasContext
from .distance import DistanceBias, distance_range

__all__ = ["DistanceTable", "TabulatedDistanceBias"]


@dataclass
class DistanceTable:
    """A call's bias per distance: ``table (H, high - low + 1)``, ``low`` a 0-d long tensor
    (the distance of column 0). The same for every batch row."""

    table: Tensor
    low: Tensor
    #: nothing batch-specific: backends may use one batch row of index grids
    batch_shared: ClassVar[bool] = True


class TabulatedDistanceBias(DistanceBias):
    """A distance-only bias evaluated once per distinct distance of each call.

    Subclasses give ``table_at(distance (n,)) -> (H, n)`` (all heads at once) and an
    element-wise ``bias_at_distance`` (used for floating positions, or when the positions of
    a call are so sparse that their distances span more than ``table_limit`` values).
    ``precompute`` tabulates the bias over the call's distance range ``[low, high]``
    (``DistanceTable``, or None for such calls); ``bias`` gathers from it, a pointwise
    ``score_mod`` for FlexAttention. The chunked Toeplitz path and the dense SDPA bias call
    ``distance_table`` directly: one evaluation per distance there too.
    """

    #: tabulate at most max(4 (Lq + Lk), 65536) distances per call
    TABLE_MIN: ClassVar[int] = 1 << 16

    def table_at(self, distance: Tensor) -> Tensor:
        """The bias of every head at integer ``distance (n,)``: ``(H, n)``."""
        raise NotImplementedError

    def distance_table(self, low: int, high: int, device: torch.device) -> Tensor:
        return self.table_at(torch.arange(low, high + 1, device=device))

    def table_limit(self, length_q: int, length_k: int) -> int:
        return max(4 * (length_q + length_k), self.TABLE_MIN)

    def precompute(
        self, q: Tensor, k: Tensor, ctx: BiasContext, inputs: dict[str, Tensor]
    ) -> DistanceTable | None:
        span = distance_range(ctx)
        if span is None or span[1] - span[0] >= self.table_limit(q.shape[2], k.shape[2]):
            return None
        return DistanceTable(
            table=self.distance_table(span[0], span[1], q.device),
            low=torch.tensor(span[0], device=q.device),
        )

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        distance = ctx.q_pos[b, i] - ctx.k_pos[b, j]
        data: DistanceTable | None = ctx.data
        if data is None:
            return self.bias_at_distance(h, distance)
        return data.table[h, distance - data.low]
