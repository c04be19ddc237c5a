"""Point-PQAE's view-relative positional embedding, VRPE (Zhang, Zhang, Yan, ICCV 2025,
"Towards More Diverse and Challenging Pre-training for Point Cloud Learning: Self-Supervised
Cross Reconstruction with Decoupled Views", arXiv 2509.01250; official code aHapBean/Point-PQAE
``models/pos.py``, read for the formula, not re-read for this module). A function,
not an ``Encoding``: it builds the positional *queries* of Point-PQAE's cross-view
reconstruction (view-1 patch centres plus the offset between the two crops attend to the
view-2 tokens).

    VRPE(c, delta) = concat over u in (x, y, z, dx, dy, dz) of [sin(u w), cos(u w)],
    w_i = 10000^(-i / (D / 12)),  i < D / 12,

with ``c`` a patch centre of crop 1 (each crop min-max normalised to [-1, 1] per axis) and
``delta = centre_2 - centre_1`` the offset between the crops in the original frame. Absolute
and not relative; ``D % 12 == 0``.

Shapes: ``centres (B, L, 3)``, ``offset (B, 3)`` or ``(B, L, 3)`` -> ``(B, L, dim)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...validation import check_int

__all__ = ["vrpe"]


def vrpe(centres: Tensor, offset: Tensor, dim: int) -> Tensor:
    """The VRPE of ``centres`` seen from a crop displaced by ``offset`` (module docstring),
    in the dtype of ``centres``."""
    dim = check_int(dim, "dim")
    if dim % 12:
        raise ValueError(f"dim must be a multiple of 12 (sin and cos of 6 coordinates), got {dim}")
    if not isinstance(centres, Tensor) or centres.dim() != 3 or centres.shape[-1] != 3:
        raise ValueError("centres must be a tensor (B, L, 3)")
    if not isinstance(offset, Tensor) or offset.shape[-1] != 3 or offset.dim() not in (2, 3):
        raise ValueError("offset must be a tensor (B, 3) or (B, L, 3)")
    if offset.dim() == 2:
        offset = offset[:, None, :]
    coords = torch.cat((centres, offset.to(centres).expand_as(centres)), -1)  # (B, L, 6)
    n = dim // 12
    w = 10000.0 ** (-torch.arange(n, dtype=torch.float64, device=centres.device) / n)
    ang = coords.to(torch.float64)[..., None] * w  # (B, L, 6, n)
    return torch.cat((ang.sin(), ang.cos()), -1).flatten(-2).to(centres.dtype)
