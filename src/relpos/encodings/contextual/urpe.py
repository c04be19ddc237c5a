"""URPE: universal relative positional encoding (Luo et al. 2022, "Your Transformer May Not
be as Powerful as You Expect", arXiv 2205.13401; lsj2408/URPE).

``Attn = (softmax(Q K^T / sqrt(d) + B) * C) V``: a Toeplitz bias ``B`` plus a Toeplitz matrix
``C`` that multiplies the softmax weights element-wise (``prob_multiplier``), without
renormalising. The official code was read.
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor, nn

from ..base import BiasContext
from ..bias.distance import DistanceBias, distance_range
from ..options import Float, Int
from ..registry import register

__all__ = ["URPE", "urpe_bucket"]


def urpe_bucket(
    relative_position: Tensor, num_buckets: int = 64, max_distance: int = 128
) -> Tensor:
    """URPE's signed bucket of ``relative_position = j - i`` (lsj2408/URPE
    ``relative_position_bucket``, then ``bucket[bucket >= 0] += 2`` and the shift to 0), in
    ``[0, num_buckets]``.

    With ``half = num_buckets // 2`` and ``exact = half // 2``: ``n = |j - i|`` is its own
    bucket below ``exact``, then ``exact + floor(log(n / exact) / log(max_distance / exact) *
    (half - exact))`` capped at ``half - 1``; the sign is kept, ``+2`` for ``j >= i``, and
    everything moves up by ``half - 1`` (the official code subtracts the table's minimum,
    which is ``-(half - 1)`` once ``max_seq_len`` reaches the capped bucket).
    """
    half = num_buckets // 2
    exact = half // 2
    n = relative_position.abs()
    large = exact + (
        torch.log(n.clamp(min=1).float() / exact) / math.log(max_distance / exact) * (half - exact)
    ).to(torch.long)
    large = large.clamp(max=half - 1)
    bucket = torch.where(n < exact, n, large) * torch.sign(relative_position)
    return torch.where(bucket >= 0, bucket + 2, bucket) + (half - 1)


@register("urpe")
class URPE(DistanceBias):
    """URPE, universal RPE (Luo et al. 2022, "Your Transformer May Not be as Powerful as You
    Expect", arXiv 2205.13401; official code lsj2408/URPE).

        Attn = ( softmax(Q K^T / sqrt(d) + B) * C ) V          (element-wise *, no renormalising)

    with Toeplitz ``B_h(i, j) = beta[idx(j - i), h]`` and ``C_h(i, j) = gamma[idx(j - i), h]``.
    Rows of ``softmax * C`` need not sum to 1: that is the point of URPE. ``beta`` is
    initialised ``N(0, init_std^2)`` (BERT init, 0.02) and ``gamma`` to 1
    (``--constant-init-ur-attn``), so training starts as plain RPE attention.

    Tables: by default one row per offset (the paper's ``--rel-pos-unique --ur-attn-unique``),
    ``(2 max_length - 1, H)`` each, ``idx = j - i + max_length - 1``; a call whose distances
    exceed ``max_length - 1`` raises ``ValueError`` (any absolute positions are fine).
    ``num_buckets=n`` uses the official signed buckets instead (``urpe_bucket``, ``n + 1``
    rows, any length; official default ``n = 64``, ``max_distance = 128``; ``n >= 4`` and
    ``max_distance > n // 4``). The official code computes B and C once and shares them
    across layers: share one encoding module (``relpos.nn.TransformerLM`` does by default).
    Padded keys get weight 0 from the mask. Needs the attention weights: backends ``eager``
    and ``chunked`` only.
    """

    paper = "Luo et al. 2022 (URPE)"
    multiplies_probs = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        max_length: Annotated[int, Int(doc="largest |i - j| + 1 of the unbucketed tables")] = 2048,
        num_buckets: Annotated[
            int | None, Int(minimum=4, optional=True, doc="official signed buckets (None: off)")
        ] = None,
        max_distance: Annotated[
            int, Int(minimum=2, doc="distance from which buckets are shared")
        ] = 128,
        init_std: Annotated[float, Float(minimum=0.0, doc="std of beta's initial values")] = 0.02,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.max_length = max_length
        if num_buckets is not None and max_distance <= num_buckets // 4:
            raise ValueError(
                f"max_distance must be > num_buckets // 4 = {num_buckets // 4} (the exact "
                f"buckets), got max_distance={max_distance}"
            )
        self.num_buckets, self.max_distance = num_buckets, max_distance
        rows = 2 * max_length - 1 if num_buckets is None else num_buckets + 1
        self.beta = nn.Parameter(torch.randn(rows, num_heads) * init_std)
        self.gamma = nn.Parameter(torch.ones(rows, num_heads))

    def index(self, distance: Tensor) -> Tensor:
        """Table row of ``distance = i - j`` (offset ``j - i = -distance``)."""
        if self.num_buckets is None:
            return self.max_length - 1 - distance
        return urpe_bucket(-distance, self.num_buckets, self.max_distance)

    def precompute(self, q: Tensor, k: Tensor, ctx: BiasContext, inputs: dict[str, Tensor]):
        """Nothing to precompute; checks that the call's distances fit the tables."""
        span = distance_range(ctx) if self.num_buckets is None else None
        if span is not None:
            far = max(-span[0], span[1])
            if far >= self.max_length:
                raise ValueError(
                    f"q_pos and k_pos are up to {far} apart, but urpe has tables for offsets "
                    f"-{self.max_length - 1}..{self.max_length - 1} (max_length="
                    f"{self.max_length}); create it with a larger max_length or num_buckets"
                )
        return None

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        return self.beta[self.index(distance), h]

    def prob_multiplier(
        self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor
    ) -> Tensor:
        return self.gamma[self.index(ctx.q_pos[b, i] - ctx.k_pos[b, j]), h]

    def extra_repr(self) -> str:
        if self.num_buckets is None:
            return f"{super().extra_repr()}, max_length={self.max_length}"
        return (
            f"{super().extra_repr()}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}"
        )
