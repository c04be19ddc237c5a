"""Relative positions on image and video grids: Swin tables (2-D, 3-D), Swin-V2's continuous
position bias, MViTv2's decomposed relative positions; CoordConv coordinate channels.

Positions are integer grid coordinates ``(B|1, L, m)`` (``m = dims``: ``(h, w)`` or
``(t, h, w)``) of the tokens inside one attention window (Swin) or one feature map (MViTv2);
``swin_window_coordinates`` gives the row-major coordinates of a whole window. Every
encoding here has a learned table that covers its window only: coordinates outside
``[0, size_a)`` on some axis ``a`` raise ``ValueError`` (``max_positions`` is the smallest
window side; ``check_positions`` checks each axis).

Conventions follow the official code: the relative coordinate is ``q - k`` per axis (Swin's
``coords[:, :, None] - coords[:, None, :]``, MViTv2's ``dist``), and biases are added after
the ``1/sqrt(d)`` scaling. Spec: ``../shared/spec/formulas-bias.md`` sections 15-16.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...registry import register
from ..base import BiasContext, Encoding

__all__ = [
    "swin_window_coordinates",
    "swin_relative_index",
    "swin_relative_position_index",
    "resize_relative_position_table",
    "swin_v2_coordinates_table",
    "mvit_relative_distance",
    "add_coord_channels",
    "SwinBias2D",
    "SwinBias3D",
    "SwinV2Bias",
    "MViTv2Decomposed",
    "MViTv2Decomposed3D",
]


# ------------------------------------------------------------------------------ pure functions
def _grid_size(value: object, dims: int, name: str, minimum: int = 1) -> tuple[int, ...]:
    """An int (same on every axis) or a sequence of ``dims`` ints, each ``>= minimum``."""
    items = [value] * dims if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(items, (tuple, list)) or len(items) != dims:
        raise ValueError(f"{name} must be an int or {dims} ints (one per axis), got {value!r}")
    for v in items:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ValueError(f"{name} must hold ints >= {minimum}, got {value!r}")
    return tuple(items)


def swin_window_coordinates(window_size: Sequence[int]) -> Tensor:
    """Coordinates of the tokens of one window in row-major order (Swin's token order):
    ``(N, m)`` int64 with ``N = prod(window_size)``, the last axis fastest."""
    ws = _grid_size(tuple(window_size), len(window_size), "window_size")
    axes = torch.meshgrid(*(torch.arange(w) for w in ws), indexing="ij")
    return torch.stack([a.reshape(-1) for a in axes], dim=-1)


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
    ws = _grid_size(tuple(window_size), len(window_size), "window_size")
    coords = swin_window_coordinates(ws)
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
    old = _grid_size(tuple(old_window), dims, "old_window")
    new = _grid_size(tuple(new_window), dims, "new_window")
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
    ws = _grid_size(tuple(window_size), 2, "window_size")
    ref = (
        ws
        if pretrained_window_size is None
        else _grid_size(tuple(pretrained_window_size), 2, "pretrained_window_size")
    )
    axes = [torch.arange(-(w - 1), w, dtype=torch.float32) for w in ws]
    table = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1)
    for a in range(2):
        table[..., a] /= ref[a] - 1
    table = table * 8
    return torch.sign(table) * torch.log2(torch.abs(table) + 1.0) / math.log2(8)


def mvit_relative_distance(q_size: int, k_size: int) -> Tensor:
    """MViTv2's per-axis distance index ``(q_size, k_size)`` int64 (``cal_rel_pos_spatial``).

    ``q_ratio = max(k/q, 1)``, ``k_ratio = max(q/k, 1)``,
    ``dist[i, j] = trunc(i q_ratio - j k_ratio + (k - 1) k_ratio)``: equal sizes give
    ``i - j + k - 1``; pooled keys are compared at their stride-scaled coordinates.
    """
    for name, v in (("q_size", q_size), ("k_size", k_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    q_ratio = max(k_size / q_size, 1.0)
    k_ratio = max(q_size / k_size, 1.0)
    dist = torch.arange(q_size)[:, None] * q_ratio - torch.arange(k_size)[None, :] * k_ratio
    dist += (k_size - 1) * k_ratio
    return dist.long()


def add_coord_channels(
    x: Tensor, *, with_r: bool = False, r_center: tuple[float, float] = (0.0, 0.0)
) -> Tensor:
    """CoordConv (Liu et al. 2018, "An intriguing failing of convolutional neural networks
    and the CoordConv solution", arXiv 1807.03247): append coordinate channels.

    ``x (B, C, H, W)`` -> ``(B, C + 2 [+ 1], H, W)``: channel ``C`` is the column coordinate
    ``x`` and ``C + 1`` the row coordinate ``y``, each ``linspace(-1, 1)`` over its axis (0 for
    an axis of length 1); ``with_r`` adds ``r = sqrt((x - cx)^2 + (y - cy)^2)`` with
    ``(cx, cy) = r_center``. The official ``AddCoords`` (TensorFlow) names the *row* index
    "x" and measures r from ``(0.5, 0.5)`` (``r_center=(0.5, 0.5)`` reproduces it); here r
    defaults to the distance from the image centre. Dtype and device follow ``x``.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor (B, C, H, W), got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"x must have shape (B, C, H, W), got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    batch, _, height, width = x.shape

    def axis(n: int) -> Tensor:
        if n == 1:
            return torch.zeros(1, dtype=x.dtype, device=x.device)
        return torch.linspace(-1.0, 1.0, n, dtype=x.dtype, device=x.device)

    xx = axis(width)[None, :].expand(height, width)
    yy = axis(height)[:, None].expand(height, width)
    channels = [xx, yy]
    if with_r:
        channels.append(torch.sqrt((xx - r_center[0]) ** 2 + (yy - r_center[1]) ** 2))
    coords = torch.stack(channels)[None].expand(batch, -1, -1, -1)
    return torch.cat([x, coords], dim=1)


# ------------------------------------------------------------------------------ base class
class GridEncoding(Encoding):
    """Base of encodings over integer grid coordinates bounded by a window / feature map.

    Queries live on a grid of ``q_size`` and keys on one of ``k_size`` (equal except for
    MViTv2's pooled keys). ``check_positions`` raises ``ValueError`` for any coordinate
    outside ``[0, size_a)`` on axis ``a``; ``max_positions`` is the smallest side, so
    coordinates below it are valid on every axis.
    """

    family = "bias"
    has_bias = True
    relative = True

    def _set_sizes(self, q_size: tuple[int, ...], k_size: tuple[int, ...]) -> None:
        self.q_size = q_size
        self.k_size = k_size
        self.max_positions = min(q_size + k_size)

    def check_positions(self, pos: Tensor, name: str) -> None:
        if pos.numel() == 0:
            return
        sizes = self.q_size if name.startswith("q") else self.k_size
        flat = pos.reshape(-1, pos.shape[-1])
        lo, hi = flat.amin(0).tolist(), flat.amax(0).tolist()
        for a, size in enumerate(sizes):
            if lo[a] < 0 or hi[a] >= size:
                raise ValueError(
                    f"{name} axis {a} spans coordinates {lo[a]}..{hi[a]}, but encoding "
                    f"{self.name!r} has a learned table for a grid of {sizes} "
                    f"(axis {a}: 0..{size - 1}; max_positions={self.max_positions} on every "
                    f"axis); coordinates are positions inside the window"
                )

    def table_row(self, ctx: BiasContext, b: Tensor, i: Tensor, j: Tensor) -> Tensor:
        """Swin table row of each (query, key) pair. Positions are gathered one axis at a
        time (``q_pos[b, i, a]``): FlexAttention's score_mod needs scalar gathers (an
        ``(m,)`` gather per score compiles to wrong results in torch 2.13)."""
        deltas = [ctx.q_pos[b, i, a] - ctx.k_pos[b, j, a] for a in range(self.dims)]
        return swin_relative_index(deltas, self.q_size)


class _SwinTable(GridEncoding):
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
    """

    paper = "Liu et al. 2021 (Swin Transformer)"
    default_window: ClassVar[tuple[int, ...]] = ()

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        window_size: int | Sequence[int] | None = None,
    ) -> None:
        super().__init__(num_heads, head_dim)
        ws = _grid_size(
            self.default_window if window_size is None else window_size, self.dims, "window_size"
        )
        self.window_size = ws
        self._set_sizes(ws, ws)
        rows = math.prod(2 * w - 1 for w in ws)
        table = torch.empty(rows, num_heads)
        nn.init.trunc_normal_(table, std=0.02)
        self.relative_position_bias_table = nn.Parameter(table)

    @property
    def relative_position_index(self) -> Tensor:
        """The official ``(N, N)`` index of a full window in row-major token order."""
        return swin_relative_position_index(self.window_size)

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        index = self.table_row(ctx, b, i, j)
        return self.relative_position_bias_table[index, h]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, window_size={self.window_size}"


@register("swin-2d")
class SwinBias2D(_SwinTable):
    __doc__ = (
        _SwinTable.__doc__ + "\n    2-D: positions ``(h, w)``; default window 7 (Swin-T/S/B).\n"
    )
    dims = 2
    default_window = (7, 7)


@register("swin-3d")
class SwinBias3D(_SwinTable):
    __doc__ = (
        _SwinTable.__doc__
        + "\n    3-D (Video Swin): positions ``(t, h, w)``; default window (8, 7, 7)"
        " (the ``window877`` configs). The 3-D index is Authority B in the spec (public copies"
        " of the Video Swin code agree).\n"
    )
    paper = "Liu et al. 2022 (Video Swin Transformer)"
    dims = 3
    default_window = (8, 7, 7)


@register("swin-v2")
class SwinV2Bias(GridEncoding):
    """Swin-V2 log-spaced continuous position bias (Liu et al. 2022, "Swin Transformer V2",
    arXiv 2111.09883; microsoft/Swin-Transformer ``swin_transformer_v2.WindowAttention``).

    ``b_h(i, j) = 16 sigmoid(MLP(c(p_i - p_j)))_h`` with ``c`` the log-spaced coordinates of
    ``swin_v2_coordinates_table`` (divided by ``pretrained_window_size - 1`` when given, else
    by ``window_size - 1``) and ``MLP = Linear(2, 512) -> ReLU -> Linear(512, H, bias=False)``
    (``cpb_mlp``, the official module names). The MLP is evaluated once per call on the
    ``(2Wh-1)(2Ww-1)`` coordinates (``prepare``), then gathered like the Swin table.
    Positions ``(B|1, L, 2)`` inside the window, as for ``swin-2d``; default window 8
    (SwinV2-T/S/B ``window8``).

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
        window_size: int | Sequence[int] = 8,
        pretrained_window_size: int | Sequence[int] | None = None,
        mlp_width: int = 512,
    ) -> None:
        super().__init__(num_heads, head_dim)
        minimum = 1 if pretrained_window_size is not None else 2
        ws = _grid_size(window_size, 2, "window_size", minimum=minimum)
        pre = None
        if pretrained_window_size is not None:
            pre = _grid_size(pretrained_window_size, 2, "pretrained_window_size", minimum=2)
        if isinstance(mlp_width, bool) or not isinstance(mlp_width, int) or mlp_width < 1:
            raise ValueError(f"mlp_width must be a positive int, got {mlp_width!r}")
        self.window_size = ws
        self.pretrained_window_size = pre
        self._set_sizes(ws, ws)
        self.cpb_mlp = nn.Sequential(
            nn.Linear(2, mlp_width, bias=True),
            nn.ReLU(inplace=True),
            nn.Linear(mlp_width, num_heads, bias=False),
        )
        self.register_buffer(
            "relative_coords_table", swin_v2_coordinates_table(ws, pre), persistent=False
        )

    def bias_table(self) -> Tensor:
        """``16 sigmoid(MLP(c))`` for every relative coordinate: ``(rows, H)``."""
        coords = self.relative_coords_table.to(self.cpb_mlp[0].weight.dtype)
        return 16 * torch.sigmoid(self.cpb_mlp(coords).reshape(-1, self.num_heads))

    def prepare(
        self,
        q: Tensor,
        k: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        inputs: dict[str, Tensor] | None = None,
    ) -> BiasContext:
        ctx = super().prepare(q, k, q_pos, k_pos, inputs)
        ctx.extra["table"] = self.bias_table()
        return ctx

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return ctx.extra["table"][self.table_row(ctx, b, i, j), h]

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, window_size={self.window_size}, "
            f"pretrained_window_size={self.pretrained_window_size}"
        )


class _MViTv2(GridEncoding):
    """MViTv2 decomposed relative positions (Li et al. 2022, "MViTv2: Improved Multiscale
    Vision Transformers for Classification and Detection", arXiv 2112.01526;
    facebookresearch/mvit ``cal_rel_pos_spatial``, SlowFast ``cal_rel_pos_temporal``).

    ``b_h(i, j) = sum_a q_i . R_a[dist_a(i_a, j_a)]`` over the axes ``a`` (``h, w``; video:
    ``t, h, w``), with one table ``R_a (2 max(q_a, k_a) - 1, D)`` per axis, shared by the
    heads (``rel_pos_h``, ``rel_pos_w``, ``rel_pos_t``: the official names),
    ``trunc_normal(std=0.02)`` (``zero_init=True``: zeros, ``REL_POS_ZERO_INIT``), and
    ``dist_a = mvit_relative_distance(q_a, k_a)``, which scales coordinates by the q/k size
    ratio when the keys are pooled (``kv_size < q_size``) or the queries are.

    The term reads the **unscaled** query, as the official code does (``attn = (q * scale)
    @ k^T`` then ``+ q . R``): it is not multiplied by the call's ``scale``. ``prepare``
    computes ``q @ R_a^T`` ``(B, H, Lq, 2 max - 1)`` per axis; ``bias`` gathers it: no
    ``(L, L, D)`` tensor. Positions: query coordinates inside ``q_size``, key coordinates
    inside ``kv_size``. Not included: the class token (official: only the spatial block gets
    the term; attend to it with positions of your own or leave it out of the call) and the
    interpolation of ``R_a`` for a new input size.
    """

    family = "contextual"

    paper = "Li et al. 2022 (MViTv2)"
    default_size: ClassVar[tuple[int, ...]] = ()
    axis_names: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        q_size: int | Sequence[int] | None = None,
        kv_size: int | Sequence[int] | None = None,
        zero_init: bool = False,
    ) -> None:
        super().__init__(num_heads, head_dim)
        qs = _grid_size(self.default_size if q_size is None else q_size, self.dims, "q_size")
        ks = qs if kv_size is None else _grid_size(kv_size, self.dims, "kv_size")
        if not isinstance(zero_init, bool):
            raise TypeError(f"zero_init must be a bool, got {zero_init!r}")
        self._set_sizes(qs, ks)
        # The distance is a function of q_pos - k_pos only when no axis is pooled.
        self.relative = qs == ks
        for a, name in enumerate(self.axis_names):
            table = torch.zeros(2 * max(qs[a], ks[a]) - 1, head_dim)
            if not zero_init:
                nn.init.trunc_normal_(table, std=0.02)
            setattr(self, f"rel_pos_{name}", nn.Parameter(table))
            self.register_buffer(
                f"dist_{name}", mvit_relative_distance(qs[a], ks[a]), persistent=False
            )

    def prepare(
        self,
        q: Tensor,
        k: Tensor,
        q_pos: Tensor,
        k_pos: Tensor,
        inputs: dict[str, Tensor] | None = None,
    ) -> BiasContext:
        ctx = super().prepare(q, k, q_pos, k_pos, inputs)
        for name in self.axis_names:
            table = getattr(self, f"rel_pos_{name}")
            ctx.extra[f"q_{name}"] = torch.matmul(q, table.t().to(q.dtype))
        return ctx

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        out = None
        for a, name in enumerate(self.axis_names):
            # scalar gathers per axis (FlexAttention's score_mod)
            dist = getattr(self, f"dist_{name}")[ctx.q_pos[b, i, a], ctx.k_pos[b, j, a]]
            term = ctx.extra[f"q_{name}"][b, h, i, dist]
            out = term if out is None else out + term
        assert out is not None
        return out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, q_size={self.q_size}, kv_size={self.k_size}"


@register("mvit2")
class MViTv2Decomposed(_MViTv2):
    __doc__ = _MViTv2.__doc__ + (
        "\n    2-D: positions ``(h, w)``, tables ``rel_pos_h``, ``rel_pos_w``; default q_size 14"
        " (MViTv2 at stride 16 of a 224 input).\n"
    )
    dims = 2
    default_size = (14, 14)
    axis_names = ("h", "w")


@register("mvit2-3d")
class MViTv2Decomposed3D(_MViTv2):
    __doc__ = _MViTv2.__doc__ + (
        "\n    3-D (video, SlowFast MViTv2): positions ``(t, h, w)``, tables ``rel_pos_t``,"
        " ``rel_pos_h``, ``rel_pos_w`` (the temporal term has the same form); default q_size"
        " (8, 14, 14).\n"
    )
    dims = 3
    default_size = (8, 14, 14)
    axis_names = ("t", "h", "w")
