"""``RelFlexformerAttention``: linear attention over tokens at arbitrary m-D positions with a
learnable integrable modulation of relative positions (seed 3; ``relpos.efficient.
relflexformer`` holds the math, the NUFFT path and the build-time checks)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..efficient.feature_maps import FeatureMap, create_feature_map
from ..efficient.relflexformer import (
    METHODS,
    Modulation,
    create_modulation,
    relflexformer_attention,
)
from ..validation import check_choice, check_float, check_int
from .head_projections import ProjectedHeads

__all__ = ["RelFlexformerAttention"]


class RelFlexformerAttention(ProjectedHeads, nn.Module):
    """Multi-head RelFlexformer attention (Kim et al. 2026, seed 3; authority C).

    ``z_i = sum_j f_h(r_i - r_j) (phi(q_i) . phi(k_j)) v_j / sum_j f_h(r_i - r_j)
    (phi(q_i) . phi(k_j))`` per head, with ``q, k, v`` linear projections of ``x``, a
    non-negative feature map ``phi`` and a modulation ``f_h`` with a learnable scale per head.

    Args:
        dim, num_heads: model width and heads (``head_dim = dim // num_heads``).
        dims: position axes m (1, 2, 3).
        modulation: ``"gaussian"``, ``"cauchy"`` or a ``Modulation``; ``modulation_options``
            (``scale``: one number or one per head, in position units; ``learnable``).
        feature_map: ``"elu1"``, ``"relu"``, ``"prf"`` or a ``FeatureMap`` for ``head_dim``.
        method: ``"nufft"`` (default, O(L log L)), ``"quadrature"``, ``"direct"`` (exact
            O(L^2)) or ``"random"`` (``num_samples`` random Fourier features of the
            modulation, a rank-2K fold drawn at construction from ``seed``; ``redraw()``).
        tol: the quadrature / NUFFT tolerance (``relflexformer.plan_grid`` raises when the
            positions make it unreachable).

    ``forward(x (B, L, dim), pos (B|1, L, m) float, mask (B, L) bool = None) -> (B, L, dim)``;
    ``mask`` False marks padded tokens (they are never attended to).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        dims: int = 3,
        modulation: str | Modulation = "gaussian",
        modulation_options: dict[str, Any] | None = None,
        feature_map: str | FeatureMap = "elu1",
        method: str = "nufft",
        tol: float = 1e-6,
        num_samples: int = 64,
        seed: int = 0,
        bias: bool = False,
    ) -> None:
        super().__init__()
        dim = check_int(dim, "dim")
        num_heads = check_int(num_heads, "num_heads")
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.method = check_choice(method, "method", METHODS)
        self.tol = check_float(tol, "tol", above=0.0, below=1.0)
        self.modulation = create_modulation(
            modulation, num_heads, dims, **(modulation_options or {})
        )
        self.feature_map = create_feature_map(feature_map, self.head_dim)
        self._build_projections(bias)
        self.num_samples = check_int(num_samples, "num_samples")
        self.seed = check_int(seed, "seed", minimum=0)
        base = self.modulation.draw(self.num_samples, torch.Generator().manual_seed(self.seed))
        self.register_buffer("random_base", base)

    @torch.no_grad()
    def redraw(self, generator: torch.Generator | None = None) -> None:
        """New random frequencies for ``method="random"`` (in place)."""
        self.random_base.copy_(self.modulation.draw(self.num_samples, generator))

    def forward(self, x: Tensor, pos: Tensor, mask: Tensor | None = None) -> Tensor:
        q, k, v = self._project(x)
        scale = self.head_dim**-0.5
        phi_q, _ = self.feature_map(q, "q", scale)
        phi_k, _ = self.feature_map(k, "k", scale)  # a per-(b, h) key offset cancels
        out = relflexformer_attention(
            phi_q,
            phi_k,
            v,
            pos,
            pos,
            self.modulation,
            method=self.method,
            tol=self.tol,
            key_valid=mask,
            random_base=self.random_base,
        )
        return self._merge(out.to(x.dtype))

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, method={self.method!r}, tol={self.tol:g}"
        )
