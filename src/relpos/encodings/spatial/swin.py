"""Swin relative position biases on attention windows: the learned table of Swin (2-D) and
Video Swin (3-D), its resizing to a new window, and Swin-V2's continuous position bias.

Positions are integer coordinates ``(B|1, L, m)`` inside one attention window
(``spatial.grid``); a full window in Swin's token order is ``swin_window_coordinates(W)``.
The relative coordinate is ``q - k`` per axis (Swin's ``coords[:, :, None] -
coords[:, None, :]``), and biases are added after the ``1/sqrt(d)`` scaling, as in the
official code (microsoft/Swin-Transformer). The shifted-window mask and the window partition
are the caller's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..base import BiasContext
from ..options import Int
from ..registry import register
from .grid import GridEncoding, GridSize, grid_coordinates, grid_size

__all__ = [
    "swin_window_coordinates",
    "swin_relative_index",
    "swin_relative_position_index",
    "resize_relative_position_table",
    "swin_v2_coordinates_table",
    "SwinBias",
    "SwinBias2D",
    "SwinBias3D",
    "SwinV2Bias",
    "SwinV2Data",
]

#: the tokens of one window in Swin's (row-major) order: ``(N, m)`` int64
swin_window_coordinates = grid_coordinates


# ------------------------------------------------------------------------------ pure functions
def swin_relative_index(delta: Tensor | Sequence[Tensor], window_size: Sequence[int]) -> Tensor:
    """Row of the Swin table for relative coordinates ``delta = q - k``: a tensor ``(..., m)``
    or one tensor per axis.

    2-D: ``(dh + Wh - 1) (2 Ww - 1) + (dw + Ww - 1)``; 3-D (Video Swin):
    ``(dd + Wd - 1) (2 Wh - 1) (2 Ww - 1) + (dh + Wh - 1) (2 Ww - 1) + (dw + Ww - 1)``.
    """
    axes = delta.unbind(-1) if isinstance(delta, Tensor) else list(delta)
    if len(axes) != len(window_size):
        raise ValueError(
            f"delta must have {len(window_size)} coordinates (one per window axis), got {len(axes)}"
        )
    index = axes[0] + (window_size[0] - 1)
    for a in range(1, len(window_size)):
        index = index * (2 * window_size[a] - 1) + (axes[a] + (window_size[a] - 1))
    return index


def swin_relative_position_index(window_size: Sequence[int]) -> Tensor:
    """Swin's ``relative_position_index`` ``(N, N)``, ``N = prod(window_size)``: the table
    row of every (query, key) pair of a window in row-major token order (official
    ``WindowAttention`` buffer; 3-D as in Video Swin). ``window_size``: 2 or 3 sides."""
    ws = grid_size(tuple(window_size), len(window_size), "window_size")
    coords = grid_coordinates(ws)
    return swin_relative_index(coords[:, None, :] - coords[None, :, :], ws)


def resize_relative_position_table(
    table: Tensor, old_window: Sequence[int], new_window: Sequence[int]
) -> Tensor:
    """Resize a Swin table ``(prod(2 W_a - 1), H)`` from one window size to another.

    2-D: bicubic interpolation of the ``(2Wh-1, 2Ww-1)`` grid of each head, as the official
    Swin code does when loading a checkpoint at a new window size
    (``F.interpolate(..., mode="bicubic")``, ``align_corners=False``). 3-D (no official
    counterpart; Video Swin inflates 2-D tables instead): trilinear. Same size: a copy.
    """
    if not isinstance(table, Tensor) or table.dim() != 2:
        raise ValueError(f"table must be a (rows, H) tensor, got {table!r:.80}")
    if len(old_window) not in (2, 3) or len(new_window) != len(old_window):
        raise ValueError(
            f"old_window and new_window must both have 2 or 3 sides, got {old_window!r} and "
            f"{new_window!r}"
        )
    dims = len(old_window)
    old = grid_size(tuple(old_window), dims, "old_window")
    new = grid_size(tuple(new_window), dims, "new_window")
    old_grid = tuple(2 * w - 1 for w in old)
    new_grid = tuple(2 * w - 1 for w in new)
    if table.shape[0] != math.prod(old_grid):
        raise ValueError(
            f"table has {table.shape[0]} rows but old_window {old} needs {math.prod(old_grid)}"
        )
    if old_grid == new_grid:
        return table.clone()
    heads = table.shape[1]
    grid = table.t().reshape(1, heads, *old_grid)
    mode = "bicubic" if dims == 2 else "trilinear"
    out = F.interpolate(grid, size=new_grid, mode=mode, align_corners=False)
    return out.reshape(heads, -1).t().contiguous()


def swin_v2_coordinates_table(
    window_size: Sequence[int], pretrained_window_size: Sequence[int] | None = None
) -> Tensor:
    """Swin-V2's log-spaced relative coordinates ``(2Wh-1, 2Ww-1, 2)`` (float32).

    ``delta / (W_pre - 1) * 8`` (``W_pre`` = the pre-training window, or the window itself),
    then ``sign(x) log2(|x| + 1) / log2(8)``: in ``[-1, 1]`` on the training window.
    """
    ws = grid_size(tuple(window_size), 2, "window_size")
    ref = (
        ws
        if pretrained_window_size is None
        else grid_size(tuple(pretrained_window_size), 2, "pretrained_window_size", minimum=2)
    )
    if min(ref) < 2:
        raise ValueError(
            f"window_size must be >= 2 on both axes when no pretrained_window_size is given "
            f"(coordinates are divided by W - 1), got {window_size!r}"
        )
    axes = [torch.arange(-(w - 1), w, dtype=torch.float32) for w in ws]
    table = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1)
    for a in range(2):
        table[..., a] /= ref[a] - 1
    table = table * 8
    return torch.sign(table) * torch.log2(torch.abs(table) + 1.0) / math.log2(8)


# ------------------------------------------------------------------------------ encodings
class SwinBias(GridEncoding):
    """Swin relative position bias (Liu et al. 2021, "Swin Transformer", arXiv 2103.14030;
    microsoft/Swin-Transformer ``WindowAttention``; 3-D: Liu et al. 2022, "Video Swin
    Transformer", arXiv 2106.13230).

    ``b_h(i, j) = B[index(p_i - p_j), h]`` with one learned table
    ``B (prod_a (2 W_a - 1), H)``, ``trunc_normal(std=0.02)``, and
    ``index = (dh + Wh - 1)(2Ww - 1) + (dw + Ww - 1)`` (3-D: time first, see
    ``swin_relative_index``). Positions: ``(B|1, L, m)`` integer coordinates inside the window
    ``[0, W_a)``; a full window in Swin's token order is ``swin_window_coordinates(W)``, for
    which the bias is ``B[relative_position_index]`` (the official buffer). The shifted-window
    mask and the window partition are the caller's. The table's name matches the official
    checkpoints (``relative_position_bias_table``); ``resize_relative_position_table`` moves it
    to another window size.

    Args:
        window_size: an int or one int per axis (default: the subclass's ``default_window``).
    """

    paper = "Liu et al. 2021 (Swin Transformer)"
    default_window: ClassVar[tuple[int, ...]] = ()

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        window_size: Annotated[
            int | Sequence[int] | None, GridSize(dims=None, optional=True)
        ] = None,
    ) -> None:
        super().__init__(num_heads, head_dim)
        ws = self.default_window if window_size is None else window_size
        self.window_size = tuple(ws)  # a tuple already: the declared option normalises it
        self._set_sizes(self.window_size, self.window_size)
        rows = math.prod(2 * w - 1 for w in self.window_size)
        table = torch.empty(rows, num_heads)
        nn.init.trunc_normal_(table, std=0.02)
        self.relative_position_bias_table = nn.Parameter(table)

    @property
    def relative_position_index(self) -> Tensor:
        """The official ``(N, N)`` index of a full window in row-major token order."""
        return swin_relative_position_index(self.window_size)

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        index = swin_relative_index(self.axis_offsets(ctx, b, i, j, self.dims), self.q_size)
        return self.relative_position_bias_table[index, h]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, window_size={self.window_size}"


@register("swin-2d")
class SwinBias2D(SwinBias):
    __doc__ = SwinBias.__doc__ + "\n    2-D: positions ``(h, w)``; default window 7 (Swin-T/S/B).\n"
    option_overrides = {"window_size": GridSize(dims=2, optional=True)}
    dims = 2
    default_window = (7, 7)


@register("swin-3d")
class SwinBias3D(SwinBias):
    __doc__ = (
        SwinBias.__doc__
        + "\n    3-D (Video Swin): positions ``(t, h, w)``; default window (8, 7, 7)"
        " (the ``window877`` configs). The 3-D index follows public copies of the"
        " Video Swin code (they agree).\n"
    )
    option_overrides = {"window_size": GridSize(dims=3, optional=True)}
    paper = "Liu et al. 2022 (Video Swin Transformer)"
    dims = 3
    default_window = (8, 7, 7)


@dataclass
class SwinV2Data:
    """Per-call data of ``swin-v2``: the MLP evaluated on every relative coordinate."""

    #: ``16 sigmoid(MLP(c))``: ``(prod(2 W_a - 1), H)``
    table: Tensor


@register("swin-v2")
class SwinV2Bias(GridEncoding):
    """Swin-V2 log-spaced continuous position bias (Liu et al. 2022, "Swin Transformer V2",
    arXiv 2111.09883; microsoft/Swin-Transformer ``swin_transformer_v2.WindowAttention``).

    ``b_h(i, j) = 16 sigmoid(MLP(c(p_i - p_j)))_h`` with ``c`` the log-spaced coordinates of
    ``swin_v2_coordinates_table`` (divided by ``pretrained_window_size - 1`` when given, else
    by ``window_size - 1``) and ``MLP = Linear(2, 512) -> ReLU -> Linear(512, H, bias=False)``
    (``cpb_mlp``, the official module names). The MLP is evaluated once per call on the
    ``(2Wh-1)(2Ww-1)`` coordinates (``precompute``), then gathered like the Swin table.
    Positions ``(B|1, L, 2)`` inside the window, as for ``swin-2d``; default window 8
    (SwinV2-T/S/B ``window8``).

    Args:
        window_size: an int or ``(Wh, Ww)``; each side >= 2 unless
            ``pretrained_window_size`` is given.
        pretrained_window_size: the pre-training window (sides >= 2) the coordinates are
            normalised by, or None (the window itself).
        mlp_width: hidden width of ``cpb_mlp`` (official: 512).

    Not included: Swin-V2's scaled cosine attention (``cos(q, k) * exp(min(logit_scale,
    log 100))``) is a change of the attention, not of the positions: normalise q and k and
    pass ``scale`` to ``relpos.attention`` to reproduce it.
    """

    paper = "Liu et al. 2022 (Swin Transformer V2)"
    dims = 2

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        window_size: Annotated[int | Sequence[int], GridSize(dims=2)] = (8, 8),
        pretrained_window_size: Annotated[
            int | Sequence[int] | None, GridSize(dims=2, minimum=2, optional=True)
        ] = None,
        mlp_width: Annotated[int, Int(minimum=1)] = 512,
    ) -> None:
        super().__init__(num_heads, head_dim)
        ws, pre = tuple(window_size), pretrained_window_size  # normalised by the options
        # refuses a window side of 1 without a pre-training window (coordinates / (W - 1))
        coords = swin_v2_coordinates_table(ws, pre)
        self.window_size = ws
        self.pretrained_window_size = pre
        self._set_sizes(ws, ws)
        self.cpb_mlp = nn.Sequential(
            nn.Linear(2, mlp_width, bias=True),
            nn.ReLU(inplace=True),
            nn.Linear(mlp_width, num_heads, bias=False),
        )
        self.register_buffer("relative_coords_table", coords, persistent=False)

    def bias_table(self) -> Tensor:
        """``16 sigmoid(MLP(c))`` for every relative coordinate: ``(rows, H)``."""
        coords = self.relative_coords_table.to(self.cpb_mlp[0].weight.dtype)
        return 16 * torch.sigmoid(self.cpb_mlp(coords).reshape(-1, self.num_heads))

    def precompute(
        self, q: Tensor, k: Tensor, ctx: BiasContext, inputs: dict[str, Tensor]
    ) -> SwinV2Data:
        return SwinV2Data(table=self.bias_table())

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        index = swin_relative_index(self.axis_offsets(ctx, b, i, j, 2), self.q_size)
        return ctx.data.table[index, h]

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, window_size={self.window_size}, "
            f"pretrained_window_size={self.pretrained_window_size}"
        )
