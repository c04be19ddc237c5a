"""LayoutLMv2 spatial-aware self-attention biases (Xu et al. 2021, "LayoutLMv2: Multi-modal
Pre-training for Visually-rich Document Understanding", arXiv 2012.14740; HF
``LayoutLMv2Encoder``, microsoft/unilm ``layoutlmft``): learned scalars per head for the
bucketed 1-D token distance and the bucketed x / y distances between word boxes.

The bucket is the bidirectional T5 bucket (``functional.t5_bucket``), whose options
(``bins``, ``max_distance``) are declared here once for both document encodings
(``T5_BUCKETS``, ``T5_MAX_DISTANCE``, ``check_t5_bucket_range``). Boxes: ``document.boxes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from torch import Tensor, nn

from ...functional import t5_bucket
from ..base import BiasContext
from ..options import Bool, Int
from ..registry import register
from .boxes import BoxEncoding

__all__ = [
    "T5_BUCKETS",
    "T5_MAX_DISTANCE",
    "check_t5_bucket_range",
    "LayoutLMv2Data",
    "LayoutLMv2Bias",
]

#: the specs of the bidirectional T5 buckets of the 1-D term (``rel_pos_bins``,
#: ``max_rel_pos`` of LayoutLMv2 and DocPolarBERT): at least 4 buckets (2 per direction, one
#: of them exact) and a log range past the exact part
T5_BUCKETS = Int(minimum=4, doc="T5 buckets of p_j - p_i (both directions)")
T5_MAX_DISTANCE = Int(minimum=2, doc="distance from which 1-D buckets saturate")


def check_t5_bucket_range(bins: int, max_distance: int, bins_name: str, max_name: str) -> None:
    """The bidirectional T5 bucket needs ``max_distance > bins // 4`` (its exact range):
    otherwise ``log(max_distance / max_exact)`` is 0 or negative and the bucket ids are
    garbage (negative ids, which index the table from its end)."""
    if max_distance <= bins // 4:
        raise ValueError(
            f"{max_name} must be > {bins_name} // 4 = {bins // 4} (the exact part of the "
            f"bidirectional T5 buckets), got {max_name}={max_distance}, {bins_name}={bins}"
        )


@dataclass
class LayoutLMv2Data:
    """Per-call box coordinates of ``layoutlmv2``: the official x0 (``x``) and y1 (``y``)
    of the query boxes ``(B, Lq)`` and key boxes ``(B, Lk)``."""

    q_x: Tensor
    q_y: Tensor
    k_x: Tensor
    k_y: Tensor


@register("layoutlmv2")
class LayoutLMv2Bias(BoxEncoding):
    """LayoutLMv2 spatial-aware self-attention (Xu et al. 2021, "LayoutLMv2: Multi-modal
    Pre-training for Visually-rich Document Understanding", arXiv 2012.14740; HF
    ``LayoutLMv2Encoder``, microsoft/unilm ``layoutlmft``).

    ``b_h(i, j) = W1[h, bucket(p_j - p_i; rel_pos_bins, max_rel_pos)]
    + Wx[h, bucket(x0_j - x0_i; rel_2d_pos_bins, max_rel_2d_pos)]
    + Wy[h, bucket(y1_j - y1_i; rel_2d_pos_bins, max_rel_2d_pos)]``,
    added after the ``1/sqrt(d)`` scaling. ``bucket`` is the bidirectional T5 bucket
    (``functional.t5_bucket``, identical to LayoutLMv2's ``relative_position_bucket``: tested
    against transformers). x uses the *left* edge ``x0`` and y the *bottom* edge ``y1`` of the
    boxes, as the official code does (``bbox[:, :, 0]``, ``bbox[:, :, 3]``). Tables are the
    official ``nn.Linear(bins, H, bias=False)`` weights ``(H, bins)`` (``rel_pos_bias``,
    ``rel_pos_x_bias``, ``rel_pos_y_bias``: the same names, so encoder weights load
    directly), initialised ``N(0, 0.02^2)``; defaults are the LayoutLMv2 config's.
    The transformers port gathers the tables under ``torch.no_grad()`` (they never train);
    the official code (one-hot @ weight) and relpos train them.

    Inputs: ``boxes (B|1, Lk, 4)`` integer ``(x0, y0, x1, y1)``, optional ``query_boxes``
    (``document.boxes``).

    Args:
        rel_pos_bins, max_rel_pos: T5 buckets of the token distance (>= 4 buckets,
            ``max_rel_pos > rel_pos_bins // 4``).
        rel_2d_pos_bins, max_rel_2d_pos: the same for the x and y distances.
        has_relative_attention_bias, has_spatial_attention_bias: the official switches of
            the 1-D and the 2-D terms (not both False).
    """

    paper = "Xu et al. 2021 (LayoutLMv2)"

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        rel_pos_bins: Annotated[int, T5_BUCKETS] = 32,
        max_rel_pos: Annotated[int, T5_MAX_DISTANCE] = 128,
        rel_2d_pos_bins: Annotated[
            int, Int(minimum=4, doc="T5 buckets of x_j - x_i and y_j - y_i")
        ] = 64,
        max_rel_2d_pos: Annotated[
            int, Int(minimum=2, doc="box distance from which 2-D buckets saturate")
        ] = 256,
        has_relative_attention_bias: Annotated[bool, Bool()] = True,
        has_spatial_attention_bias: Annotated[bool, Bool()] = True,
    ) -> None:
        super().__init__(num_heads, head_dim)
        if not (has_relative_attention_bias or has_spatial_attention_bias):
            raise ValueError(
                "has_relative_attention_bias and has_spatial_attention_bias are both False: "
                "the encoding would add nothing"
            )
        check_t5_bucket_range(rel_pos_bins, max_rel_pos, "rel_pos_bins", "max_rel_pos")
        check_t5_bucket_range(rel_2d_pos_bins, max_rel_2d_pos, "rel_2d_pos_bins", "max_rel_2d_pos")
        self.rel_pos_bins, self.max_rel_pos = rel_pos_bins, max_rel_pos
        self.rel_2d_pos_bins, self.max_rel_2d_pos = rel_2d_pos_bins, max_rel_2d_pos
        self.has_relative_attention_bias = has_relative_attention_bias
        self.has_spatial_attention_bias = has_spatial_attention_bias
        if has_relative_attention_bias:
            self.rel_pos_bias = nn.Linear(rel_pos_bins, num_heads, bias=False)
            nn.init.normal_(self.rel_pos_bias.weight, std=0.02)
        if has_spatial_attention_bias:
            self.rel_pos_x_bias = nn.Linear(rel_2d_pos_bins, num_heads, bias=False)
            self.rel_pos_y_bias = nn.Linear(rel_2d_pos_bins, num_heads, bias=False)
            nn.init.normal_(self.rel_pos_x_bias.weight, std=0.02)
            nn.init.normal_(self.rel_pos_y_bias.weight, std=0.02)

    def bucket_1d(self, relative_position: Tensor) -> Tensor:
        """Bucket of ``p_j - p_i``."""
        return t5_bucket(
            relative_position, num_buckets=self.rel_pos_bins, max_distance=self.max_rel_pos
        )

    def bucket_2d(self, relative_coordinate: Tensor) -> Tensor:
        """Bucket of ``x_j - x_i`` (or ``y``)."""
        return t5_bucket(
            relative_coordinate,
            num_buckets=self.rel_2d_pos_bins,
            max_distance=self.max_rel_2d_pos,
        )

    def precompute(
        self, q: Tensor, k: Tensor, ctx: BiasContext, inputs: dict[str, Tensor]
    ) -> LayoutLMv2Data | None:
        """The box coordinates the 2-D terms read (None without the spatial bias)."""
        if not self.has_spatial_attention_bias:
            return None
        boxes = self.query_key_boxes(q, k, inputs)
        x, y = 0, 3  # the official x0 and y1
        return LayoutLMv2Data(
            q_x=boxes.query[..., x].contiguous(),
            q_y=boxes.query[..., y].contiguous(),
            k_x=boxes.key[..., x].contiguous(),
            k_y=boxes.key[..., y].contiguous(),
        )

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        out = None
        if self.has_relative_attention_bias:
            rel = ctx.k_pos[b, j] - ctx.q_pos[b, i]
            out = self.rel_pos_bias.weight[h, self.bucket_1d(rel)]
        if self.has_spatial_attention_bias:
            d = ctx.data
            x = self.rel_pos_x_bias.weight[h, self.bucket_2d(d.k_x[b, j] - d.q_x[b, i])]
            y = self.rel_pos_y_bias.weight[h, self.bucket_2d(d.k_y[b, j] - d.q_y[b, i])]
            out = x + y if out is None else out + x + y
        assert out is not None
        return out

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, rel_pos_bins={self.rel_pos_bins}, "
            f"max_rel_pos={self.max_rel_pos}, rel_2d_pos_bins={self.rel_2d_pos_bins}, "
            f"max_rel_2d_pos={self.max_rel_2d_pos}"
        )
