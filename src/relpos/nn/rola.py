"""``RoLAAttention``: RoLA's low-rank linear-attention branch as a layer (seed 26;
``relpos.efficient.rola`` holds the math)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from ..efficient.feature_maps import FeatureMap, LowRankFeatures
from ..efficient.rola import rola_attention, rotary_schedule, select_frequencies
from ..efficient.state import LinearState
from ..encodings.base import Encoding
from ..validation import check_int
from .attention import build_encoding
from .head_projections import ProjectedHeads

__all__ = ["RoLAAttention"]


class RoLAAttention(ProjectedHeads, nn.Module):
    """Multi-head RoLA low-rank branch (authority C, efficient.md §4).

    ``z_i = sum_j (R^S_i phi(q_i)) . (R^S_j phi(k_j)) v_j / sum_j phi(q_i) . phi(k_j)`` per
    head, ``q, k, v`` projections of ``x``, ``phi = LowRankFeatures(head_dim, rank)`` (one
    learnt ``W (rank, head_dim)`` shared by the heads) or a given ``FeatureMap``, and
    ``R^S`` the rotation of ``rank / 2`` pairs of the encoding's rotary schedule
    (``frequency_subset``: ``"lowest"``, ``"highest"`` or pair indices).

    Args:
        dim, num_heads: model width and heads.
        encoding: the model's rotary encoding, a registry name (``"rope"``,
            ``"rope-axial"`` with ``encoding_options={"dims": 3}``, ``"m-rope"``, ...) or an
            instance; only its schedule and layout are read (no positional parameters are
            added beyond a learned schedule of its own).
        rank: the bottleneck ``r`` (even, at most twice the schedule's pairs).
        feature_map: a ``FeatureMap`` with ``rank`` features instead of ``LowRankFeatures``.

    ``forward(x (B, L, dim), pos=None, causal=False, mask=None, state=None) -> (B, L, dim)``:
    positions ``(B|1, L[, m])`` (default ``0..L-1`` on every axis, continued from
    ``state``); ``mask (B, L)`` bool, False for padded tokens; ``state`` a ``LinearState``
    for causal decoding (``new_state()``).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        encoding: str | Encoding = "rope",
        *,
        rank: int | None = None,
        frequency_subset: str | Sequence[int] = "lowest",
        encoding_options: dict[str, Any] | None = None,
        feature_map: FeatureMap | None = None,
        seed: int | None = None,
        bias: bool = False,
    ) -> None:
        super().__init__()
        dim, num_heads = check_int(dim, "dim"), check_int(num_heads, "num_heads")
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        enc = build_encoding(encoding, num_heads, self.head_dim, encoding_options or {})
        assert enc is not None
        self.encoding = enc
        if feature_map is None:
            rank = self.head_dim if rank is None else check_int(rank, "rank", minimum=2)
            feature_map = LowRankFeatures(self.head_dim, rank, seed=seed)
        elif rank is not None and rank != feature_map.num_features:
            raise ValueError(
                f"rank ({rank}) must equal the feature map's num_features "
                f"({feature_map.num_features})"
            )
        self.feature_map = feature_map
        self.rank = feature_map.num_features
        self.frequency_subset = frequency_subset
        select_frequencies(rotary_schedule(enc), self.rank, frequency_subset)  # checks now
        self._build_projections(bias)

    @staticmethod
    def new_state() -> LinearState:
        """An empty recurrent state for causal decoding."""
        return LinearState()

    def forward(
        self,
        x: Tensor,
        pos: Tensor | None = None,
        causal: bool = False,
        mask: Tensor | None = None,
        state: LinearState | None = None,
    ) -> Tensor:
        q, k, v = self._project(x)
        out = rola_attention(
            q,
            k,
            v,
            self.encoding,
            self.feature_map,
            frequency_subset=self.frequency_subset,
            causal=causal,
            q_pos=pos,
            k_pos=pos,
            key_valid=mask,
            state=state,
        )
        return self._merge(out)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, rank={self.rank}"
