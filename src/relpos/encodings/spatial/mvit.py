"""MViTv2 decomposed relative positions (Li et al. 2022, "MViTv2: Improved Multiscale Vision
Transformers for Classification and Detection", arXiv 2112.01526; official code
facebookresearch/mvit ``cal_rel_pos_spatial``, SlowFast ``cal_rel_pos_temporal``).

A contextual term read by the query, one table per axis: ``b_h(i, j) = sum_a q_i .
R_a[dist_a(i_a, j_a)]``. Positions are integer coordinates ``(B|1, L, m)`` of the feature
map (``spatial.grid``): query coordinates inside ``q_size``, key coordinates inside
``kv_size`` (pooled keys are smaller).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, ClassVar

import torch
from torch import Tensor, nn

from ...validation import check_int
from ..base import BiasContext
from ..contextual.table import RowIndex, TableRead, query_block_context
from ..options import Bool
from ..registry import register
from .grid import GridEncoding, GridSize

__all__ = [
    "mvit_relative_distance",
    "MViTv2",
    "MViTv2Data",
    "MViTv2Decomposed",
    "MViTv2Decomposed3D",
]


def mvit_relative_distance(q_size: int, k_size: int) -> Tensor:
    """MViTv2's per-axis distance index ``(q_size, k_size)`` int64 (``cal_rel_pos_spatial``).

    ``q_ratio = max(k/q, 1)``, ``k_ratio = max(q/k, 1)``,
    ``dist[i, j] = trunc(i q_ratio - j k_ratio + (k - 1) k_ratio)``: equal sizes give
    ``i - j + k - 1``; pooled keys are compared at their stride-scaled coordinates.
    """
    check_int(q_size, "q_size")
    check_int(k_size, "k_size")
    q_ratio = max(k_size / q_size, 1.0)
    k_ratio = max(q_size / k_size, 1.0)
    dist = torch.arange(q_size)[:, None] * q_ratio - torch.arange(k_size)[None, :] * k_ratio
    dist += (k_size - 1) * k_ratio
    return dist.long()


@dataclass
class MViTv2Data:
    """Per-call data of MViTv2: the table ``R_a`` of each axis ``a`` read by the queries
    (``contextual.table.TableRead``; products ``q @ R_a^T (B, H, Lq, 2 max - 1)``, formed
    per query block)."""

    reads: tuple[TableRead, ...]


class MViTv2(GridEncoding):
    """MViTv2 decomposed relative positions (Li et al. 2022, arXiv 2112.01526;
    facebookresearch/mvit ``cal_rel_pos_spatial``, SlowFast ``cal_rel_pos_temporal``).

    ``b_h(i, j) = sum_a q_i . R_a[dist_a(i_a, j_a)]`` over the axes ``a`` (``h, w``; video:
    ``t, h, w``), with one table ``R_a (2 max(q_a, k_a) - 1, D)`` per axis, shared by the
    heads (``rel_pos_h``, ``rel_pos_w``, ``rel_pos_t``: the official names),
    ``trunc_normal(std=0.02)`` (``zero_init=True``: zeros, ``REL_POS_ZERO_INIT``), and
    ``dist_a = mvit_relative_distance(q_a, k_a)``, which scales coordinates by the q/k size
    ratio when the keys are pooled (``kv_size < q_size``) or the queries are.

    The term reads the **unscaled** query, as the official code does (``attn = (q * scale)
    @ k^T`` then ``+ q . R``): it is not multiplied by the call's ``scale``. ``precompute``
    reads ``R_a`` with the queries (``contextual.table.TableRead``: ``q @ R_a^T``
    ``(B, H, T, 2 max - 1)`` per query block); ``bias`` gathers it: no ``(L, L, D)``
    tensor. ``relative`` is True only when no axis is pooled (``q_size == kv_size``): the
    distance is then a function of ``q_pos - k_pos``.

    Args:
        q_size: the query grid, an int or one int per axis (default: ``default_size``).
        kv_size: the key grid (pooled keys), default ``q_size``.
        zero_init: zero tables (the official ``REL_POS_ZERO_INIT``) instead of
            ``trunc_normal(0.02)``.

    Not included: the class token (official: only the spatial block gets the term; attend
    to it with positions of your own or leave it out of the call) and the interpolation of
    ``R_a`` for a new input size.
    """

    paper = "Li et al. 2022 (MViTv2)"
    default_size: ClassVar[tuple[int, ...]] = ()
    axis_names: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        q_size: Annotated[int | Sequence[int] | None, GridSize(dims=None, optional=True)] = None,
        kv_size: Annotated[int | Sequence[int] | None, GridSize(dims=None, optional=True)] = None,
        zero_init: Annotated[bool, Bool()] = False,
    ) -> None:
        super().__init__(num_heads, head_dim)
        qs = tuple(self.default_size if q_size is None else q_size)  # normalised by the options
        ks = qs if kv_size is None else tuple(kv_size)
        self._set_sizes(qs, ks)
        self.relative = qs == ks
        for a, name in enumerate(self.axis_names):
            table = torch.zeros(2 * max(qs[a], ks[a]) - 1, head_dim)
            if not zero_init:
                nn.init.trunc_normal_(table, std=0.02)
            setattr(self, f"rel_pos_{name}", nn.Parameter(table))
            self.register_buffer(
                f"dist_{name}", mvit_relative_distance(qs[a], ks[a]), persistent=False
            )

    def precompute(
        self, q: Tensor, k: Tensor, ctx: BiasContext, inputs: dict[str, Tensor]
    ) -> MViTv2Data:
        tables = (getattr(self, f"rel_pos_{name}") for name in self.axis_names)
        return MViTv2Data(reads=tuple(TableRead.queries(q, t.to(q.dtype), 0) for t in tables))

    def block_context(self, ctx: BiasContext, i: Tensor, j: Tensor) -> BiasContext:
        return query_block_context(ctx, i)  # q_block @ R_a^T for the block's queries

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        out = None
        for a, name in enumerate(self.axis_names):
            # scalar gathers per axis (FlexAttention's score_mod)
            dist = getattr(self, f"dist_{name}")[ctx.q_pos[b, i, a], ctx.k_pos[b, j, a]]
            term = ctx.data.reads[a].read(b, h, i, RowIndex(dist, None, 0))
            out = term if out is None else out + term
        assert out is not None
        return out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, q_size={self.q_size}, kv_size={self.k_size}"


@register("mvitv2", aliases=("mvit2",))
class MViTv2Decomposed(MViTv2):
    __doc__ = MViTv2.__doc__ + (
        "\n    2-D: positions ``(h, w)``, tables ``rel_pos_h``, ``rel_pos_w``; default q_size 14"
        " (MViTv2 at stride 16 of a 224 input).\n"
    )
    option_overrides = {
        "q_size": GridSize(dims=2, optional=True),
        "kv_size": GridSize(dims=2, optional=True),
    }
    dims = 2
    default_size = (14, 14)
    axis_names = ("h", "w")


@register("mvitv2-3d", aliases=("mvit2-3d",))
class MViTv2Decomposed3D(MViTv2):
    __doc__ = MViTv2.__doc__ + (
        "\n    3-D (video, SlowFast MViTv2): positions ``(t, h, w)``, tables ``rel_pos_t``,"
        " ``rel_pos_h``, ``rel_pos_w`` (the temporal term has the same form); default q_size"
        " (8, 14, 14).\n"
    )
    option_overrides = {
        "q_size": GridSize(dims=3, optional=True),
        "kv_size": GridSize(dims=3, optional=True),
    }
    dims = 3
    default_size = (8, 14, 14)
    axis_names = ("t", "h", "w")
