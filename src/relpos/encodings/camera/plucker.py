"""Plücker-ray embeddings, the absolute camera baseline (code read: chengzhag/UCPE
``ray_condition`` (from CameraCtrl); RayNova ``view_embed``). A module, not an
``Encoding``: it embeds per-token rays into the token features before attention, like the
CoordConv channels of ``spatial.coords``.

Per patch-centre ray ``[o x d, d] in R^6`` (``relpos.cameras.plucker``, moment first): in
world coordinates (``frame="world"``: not invariant to a rigid change of world coordinates,
``d' = R d``, ``m' = R m + t x R d``) or relative to the first camera (``frame="first"``,
CameraCtrl: invariant, but dependent on the reference camera). RayNova's embedding:
``Linear(6, C) -> GELU -> Linear(C, C)`` with the last layer zero-initialised, added to the
tokens (so a pretrained model is unchanged at step 0); ``fourier > 0`` first maps each
coordinate to ``[sin(2^f pi x), cos(2^f pi x)]``, ``f < fourier`` (NeRF-style features).

Shapes: ``rays (B, L, 6)`` -> ``(B, L, dim)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ...validation import check_int

__all__ = ["PluckerEmbedding"]


class PluckerEmbedding(nn.Module):
    """``Linear -> GELU -> zero-init Linear`` on Plücker coordinates (see the module
    docstring). ``dim``: output width; ``fourier``: number of octaves (0: raw coordinates)."""

    def __init__(self, dim: int, fourier: int = 0) -> None:
        super().__init__()
        self.dim = check_int(dim, "dim")
        self.fourier = check_int(fourier, "fourier", minimum=0)
        width = 6 * 2 * fourier if fourier else 6
        self.inp = nn.Linear(width, dim)
        self.out = nn.Linear(dim, dim)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def features(self, rays: Tensor) -> Tensor:
        """The input features: the rays, or their Fourier features ``(B, L, 12 F)``."""
        if not self.fourier:
            return rays
        scales = (2.0 ** torch.arange(self.fourier, dtype=rays.dtype, device=rays.device)) * math.pi
        x = rays[..., None] * scales
        return torch.cat((x.sin(), x.cos()), -1).flatten(-2)

    def forward(self, rays: Tensor) -> Tensor:
        if not isinstance(rays, Tensor) or rays.dim() != 3 or rays.shape[-1] != 6:
            shape = tuple(rays.shape) if isinstance(rays, Tensor) else type(rays).__name__
            raise ValueError(f"rays must have shape (B, L, 6) = [o x d, d], got {shape}")
        return self.out(nn.functional.gelu(self.inp(self.features(rays))))
