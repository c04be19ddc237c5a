"""Sandwich (Chi et al. 2023, "Dissecting Transformer Length Extrapolation via the Lens of
Receptive Field Analysis", arXiv 2212.10356): the inner product of sinusoidal embeddings as a
parameter-free bias, compressed per head like ALiBi's slopes.

``b_h(n) = (sum_{k=1}^{d/2} cos(n / base^(2k/d)) - d/2) / (8 (h + 1) / H)``, ``n = |i - j|``.
No code by the authors was found; the form follows NVIDIA/NeMo's port
(``sandwich_relative_position_embedding.py``).
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from ..options import Float, Int
from ..registry import register
from .distance import accurate_dtype
from .tabulated import TabulatedDistanceBias

__all__ = ["Sandwich"]


DIM = Int(minimum=2, optional=True, doc="d of the formula, even (None: head_dim)")


@register("sandwich")
class Sandwich(TabulatedDistanceBias):
    """Sandwich (Chi et al. 2023, "Dissecting Transformer Length Extrapolation via the Lens of
    Receptive Field Analysis", arXiv 2212.10356). Parameter-free.

    ``b_h(n) = (sum_{k=1}^{d/2} cos(n / base^(2k/d)) - d/2) / (8 (h + 1) / H)`` with
    ``n = |i - j|`` and heads ``h = 0 .. H-1``: the inner product ``p_i . p_j`` of sinusoidal
    embeddings minus its maximum ``d/2``, compressed per head like ALiBi's slopes. Note the
    frequency index starts at ``k = 1`` (as in NVIDIA/NeMo's port; no code by the authors was
    found). ``dim`` (``d``) defaults to ``head_dim`` (NeMo's
    ``hidden_size`` per head; the OpenNLPLab reproduction uses ``2 * head_dim``) and must be
    even. ``b <= 0``, ``b(0) = 0``; the bias is symmetric in ``i - j`` (NeMo's causal form
    zeroes future distances, which the causal mask hides anyway). Added after the
    ``1/sqrt(d)`` scaling, not scaled. ``base > 1``.

    Shapes: ``table_at(distance (n,)) -> (H, n)`` (float64 sums, stored float32).
    """

    paper = "Chi et al. 2023 (Sandwich)"
    continuous = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        dim: Annotated[int | None, DIM] = None,
        base: Annotated[float, Float(above=1.0, doc="sinusoid base")] = 10000.0,
    ) -> None:
        super().__init__(num_heads, head_dim)
        dim = head_dim if dim is None else dim
        if dim % 2:
            raise ValueError(f"dim must be even (d/2 frequencies), got {dim}")
        self.dim, self.base = dim, base
        k = torch.arange(1, dim // 2 + 1, dtype=torch.float64)
        self.register_buffer("inv_freq", base ** (-2.0 * k / dim), persistent=False)
        compression = 8.0 * torch.arange(1, num_heads + 1, dtype=torch.float64) / num_heads
        self.register_buffer("compression", compression, persistent=False)

    def _inner_product(self, n: Tensor) -> Tensor:
        """``sum_k cos(n w_k) - d/2`` for ``n >= 0`` (any shape; 0-d inside FlexAttention)."""
        inv_freq = self.inv_freq.to(n.dtype)
        if n.dim() == 0:  # FlexAttention's score_mod must stay pointwise: unrolled sum
            total = torch.zeros_like(n)
            for w in range(inv_freq.shape[0]):
                total = total + torch.cos(n * inv_freq[w])
            return total - self.dim / 2
        return torch.cos(n[..., None] * inv_freq).sum(-1) - self.dim / 2

    def table_at(self, distance: Tensor) -> Tensor:
        wide = accurate_dtype(distance.device)
        n = distance.abs().to(wide)
        out = self._inner_product(n)[None, :] / self.compression.to(wide)[:, None]
        return out.float()

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        n = distance.abs().float()
        return self._inner_product(n) / self.compression.float()[h]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, dim={self.dim}, base={self.base}"
