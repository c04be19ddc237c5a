"""CoordConv coordinate channels (Liu et al. 2018, "An intriguing failing of convolutional
neural networks and the CoordConv solution", arXiv 1807.03247): absolute pixel coordinates
appended to a feature map as extra channels. A function, not an ``Encoding``: it acts on
``(B, C, H, W)`` images before attention or convolution."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ...validation import check_bool, check_float_sequence

__all__ = ["add_coord_channels"]


def add_coord_channels(
    x: Tensor, *, with_r: bool = False, r_center: Sequence[float] = (0.0, 0.0)
) -> Tensor:
    """CoordConv's ``AddCoords``: append coordinate channels to ``x``.

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
    check_bool(with_r, "with_r")
    cx, cy = check_float_sequence(r_center, "r_center", length=2)
    batch, _, height, width = x.shape

    def axis(n: int) -> Tensor:
        if n == 1:
            return torch.zeros(1, dtype=x.dtype, device=x.device)
        return torch.linspace(-1.0, 1.0, n, dtype=x.dtype, device=x.device)

    xx = axis(width)[None, :].expand(height, width)
    yy = axis(height)[:, None].expand(height, width)
    channels = [xx, yy]
    if with_r:
        channels.append(torch.sqrt((xx - cx) ** 2 + (yy - cy) ** 2))
    coords = torch.stack(channels)[None].expand(batch, -1, -1, -1)
    return torch.cat([x, coords], dim=1)
