"""T5 relative-position buckets (Raffel et al. 2020, "Exploring the Limits of Transfer
Learning with a Unified Text-to-Text Transformer", arXiv 1910.10683; HF
``T5Attention.compute_bias``).

``b_h(i, j) = B[bucket(j - i), h]`` with a learned table ``B (num_buckets, H)``; the bucket
function is ``functional.t5_bucket`` (exact below ``num_buckets // 2`` per side, log-spaced
up to ``max_distance``), checked against HF's port of Mesh-TensorFlow's bucket function
(huggingface/transformers, ``models/t5/modeling_t5.py``).
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor, nn

from ...functional import t5_bucket
from ..options import Bool, Int
from ..registry import register
from .distance import DistanceBias

__all__ = ["T5Bias"]


@register("t5")
class T5Bias(DistanceBias):
    """T5 relative-position buckets (Raffel et al. 2020; HF ``T5Attention.compute_bias``).

    ``b_h(i, j) = B[bucket(j - i), h]`` with a learned table ``B (num_buckets, H)`` initialised
    ``N(0, (num_heads * head_dim)^-1)`` (HF: ``factor * d_model^-0.5``). ``bidirectional`` picks
    the encoder (two-sided) or decoder (causal) bucketing; ``functional.t5_bucket`` has details
    and checks that ``num_buckets`` and ``max_distance`` give every side at least one exact
    bucket and a log range (``num_buckets >= 4`` two-sided, ``>= 2`` causal, ``max_distance >
    num_buckets // 2`` (causal) or ``// 4`` (two-sided)).
    """

    paper = "Raffel et al. 2020 (T5)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        bidirectional: Annotated[
            bool, Bool(doc="encoder (two-sided) buckets; False: decoder (causal)")
        ] = False,
        num_buckets: Annotated[int, Int(minimum=2, doc="rows of the table")] = 32,
        max_distance: Annotated[
            int, Int(minimum=2, doc="distance from which buckets are shared")
        ] = 128,
    ) -> None:
        super().__init__(num_heads, head_dim)
        # checks the bucket geometry (num_buckets against max_distance) by name
        t5_bucket(
            torch.zeros(1, dtype=torch.long),
            bidirectional=bidirectional,
            num_buckets=num_buckets,
            max_distance=max_distance,
        )
        self.bidirectional = bidirectional
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        std = (num_heads * head_dim) ** -0.5
        self.table = nn.Parameter(torch.randn(num_buckets, num_heads) * std)

    def bucket(self, distance: Tensor) -> Tensor:
        """Bucket of ``relative_position = k_pos - q_pos = -distance``."""
        return t5_bucket(
            -distance,
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        return self.table[self.bucket(distance), h]

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, bidirectional={self.bidirectional}, "
            f"num_buckets={self.num_buckets}, max_distance={self.max_distance}"
        )
