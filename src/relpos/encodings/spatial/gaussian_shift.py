"""Gaussian-shift bias: attention heads that can express a convolution.

Cordonnier, Loukas & Jaggi 2020 ("On the Relationship between Self-Attention and Convolutional
Layers", arXiv 1911.03584), as used by S. Li et al. 2021 ("Can Vision Transformers Perform
Convolution?", arXiv 2111.01353): with the *quadratic* relative encoding each head h attends around
the offset ``Delta_h`` from its query,

    b_h(i, j) = -alpha_h * || (p_j - p_i) - Delta_h ||^2,

so as ``alpha_h -> inf`` head h reads exactly the token at ``p_i + Delta_h``. With ``K^m``
heads whose shifts form the ``K x ... x K`` grid (``convolution_shifts``) and no content
logits, ``sum_h W_h out_h`` is a K-tap convolution over the grid of patches, with
*replicate* padding at the borders (the nearest existing key wins), not zero padding.
The construction follows the two papers' text; neither code was read.

Positions are ``(B|1, L)`` for ``dims = 1`` or ``(B|1, L, m)`` grid coordinates; any real
coordinates are accepted (``continuous``). Parameters: ``shift (H, m)`` and ``log_alpha
(H,)`` (``alpha = exp(log_alpha)`` stays positive), both learned unless
``learnable=False``. Shapes of ``bias``: broadcast of the index tensors.
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor, nn

from ..base import BiasContext, Encoding
from ..options import Bool, Float, Int
from ..registry import register

__all__ = ["GaussianShiftBias", "convolution_shifts"]


def convolution_shifts(kernel_size: int, dims: int) -> Tensor:
    """The offsets ``(K^m, m)`` of a ``K x ... x K`` kernel in row-major order (the order of
    ``weight.flatten()`` of a ``Conv{m}d`` kernel): ``-(K // 2) .. K // 2`` on every axis."""
    half = kernel_size // 2
    axes = torch.meshgrid(
        *(torch.arange(-half, kernel_size - half, dtype=torch.float32) for _ in range(dims)),
        indexing="ij",
    )
    return torch.stack([a.reshape(-1) for a in axes], dim=-1)


def _grid_side(num_heads: int, dims: int) -> int | None:
    """``K`` when ``num_heads == K^dims`` for an odd ``K``, else None."""
    side = round(num_heads ** (1.0 / dims))
    for k in (side - 1, side, side + 1):
        if k >= 1 and k % 2 == 1 and k**dims == num_heads:
            return k
    return None


@register("gaussian-shift")
class GaussianShiftBias(Encoding):
    """Per-head Gaussian around a learned shift: ``-alpha_h ||p_j - p_i - Delta_h||^2``.

    Args:
        dims: position axes ``m`` (2: image patches ``(row, col)``; 1: sequences).
        alpha: initial concentration ``alpha_h`` (all heads); large values make each head a
            hard shift (the convolution limit), small ones a local average.
        shift_std: when ``num_heads`` is not ``K^m`` for an odd ``K``, shifts are drawn from
            ``N(0, shift_std^2)``; otherwise they start on the kernel grid
            (``convolution_shifts``), so the layer can start as a convolution.
        learnable: learn ``shift`` and ``alpha`` (else buffers).
    """

    paper = "Cordonnier et al. 2020; Li et al. 2021 (MHSA as convolution via RPE)"
    has_bias = True
    relative = True
    continuous = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        dims: Annotated[int, Int(minimum=1, maximum=3, doc="position axes")] = 2,
        alpha: Annotated[float, Float(above=0.0, doc="initial concentration of every head")] = 1.0,
        shift_std: Annotated[float, Float(above=0.0, doc="spread of random initial shifts")] = 1.0,
        learnable: Annotated[bool, Bool(doc="learn shifts and concentrations")] = True,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.dims = dims
        self.distance_only = dims == 1  # a 1-D bias is a function of q_pos - k_pos
        side = _grid_side(num_heads, dims)
        if side is not None:
            shift = convolution_shifts(side, dims)
        else:
            shift = shift_std * torch.randn(num_heads, dims)
        log_alpha = torch.full((num_heads,), math.log(alpha))
        if learnable:
            self.shift = nn.Parameter(shift)
            self.log_alpha = nn.Parameter(log_alpha)
        else:
            self.register_buffer("shift", shift)
            self.register_buffer("log_alpha", log_alpha)

    @classmethod
    def example_options(cls) -> dict:
        return {"dims": 2, "alpha": 0.5}

    def set_shifts(self, shift: Tensor, alpha: float | Tensor | None = None) -> None:
        """Set ``Delta (H, m)`` (e.g. ``convolution_shifts(K, m)``) and, optionally,
        ``alpha`` (a number or ``(H,)``), in place (under ``no_grad``)."""
        shift = torch.as_tensor(shift, dtype=self.shift.dtype, device=self.shift.device)
        if shift.shape != self.shift.shape:
            raise ValueError(
                f"shift must have shape {tuple(self.shift.shape)}, got {tuple(shift.shape)}"
            )
        with torch.no_grad():
            self.shift.copy_(shift)
            if alpha is not None:
                alpha = torch.as_tensor(alpha, dtype=self.log_alpha.dtype)
                if not bool((alpha > 0).all()) or not bool(torch.isfinite(alpha).all()):
                    raise ValueError("alpha must be finite and > 0")
                self.log_alpha.copy_(alpha.log().expand_as(self.log_alpha))

    def _bias(self, h: Tensor, delta: Tensor) -> Tensor:
        """``-alpha_h ||delta - Delta_h||^2`` for ``delta = p_j - p_i`` (``(..., m)``)."""
        alpha = self.log_alpha.exp()[h]
        if self.dims == 1:
            return -alpha * (delta - self.shift[h, 0]) ** 2
        return -alpha * ((delta - self.shift[h]) ** 2).sum(-1)

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return self._bias(h, (ctx.k_pos[b, j] - ctx.q_pos[b, i]).to(self.shift.dtype))

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        """1-D only: ``distance = q_pos - k_pos``, so ``p_j - p_i = -distance``."""
        if self.dims != 1:
            raise RuntimeError("gaussian-shift is distance-only for dims=1 only")
        return self._bias(h, (-distance).to(self.shift.dtype))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, dims={self.dims}"
