"""Concentric Causal Attention, CCA (Xing et al. 2024, "Mitigating Object Hallucination via
Concentric Causal Attention", arXiv 2410.15926; xing0047/cca-llava ``llava/cca_utils/cca.py``).

The image tokens of an ``H x W`` grid (LLaVA-1.5: 24 x 24 = 576, in raster order from
sequence index ``p``) are ordered by concentric ring, from the border inwards:

    ring(r, c) = min(r, c, H - 1 - r, W - 1 - c)          (0 = outer ring)

A token on ring ``a`` gets position ``p + a``; the text after the image continues at
``p + R`` (``R`` = number of rings = 12 for 24 x 24), so a decoding step at sequence
index ``t`` has position ``t - H W + R``. Inside the image a token attends to every image
token on rings ``<= a`` (its own ring bidirectionally); text keeps causal rules.

That mask is exactly ``k_pos <= q_pos`` on these positions (``cca_mask_mod``, for
``relpos.attention(..., mask_mod=...)``), so no ``L x L`` tensor is needed. The source
covers 24 x 24 grids; other sizes follow the same ring formula (``R = ceil(min(H, W) / 2)``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..validation import check_int, check_int_tensor


def concentric_rings(
    height: int, width: int, *, device: torch.device | str | None = None
) -> Tensor:
    """Ring index ``(height, width)`` int64 of every grid cell (0 = border)."""
    check_int(height, "height", minimum=1)
    check_int(width, "width", minimum=1)
    r = torch.arange(height, device=device)[:, None]
    c = torch.arange(width, device=device)[None, :]
    return torch.minimum(torch.minimum(r, c), torch.minimum(height - 1 - r, width - 1 - c))


def cca_positions(
    prefix_length: int,
    height: int,
    width: int,
    suffix_length: int = 0,
    *,
    device: torch.device | str | None = None,
) -> Tensor:
    """Positions ``(prefix + H W + suffix,)`` int64 for ``prefix_length`` text tokens, an
    ``H x W`` image in raster order, then ``suffix_length`` text tokens:
    ``0 .. p-1``, ``p + ring``, ``p + R, p + R + 1, ...``."""
    p = check_int(prefix_length, "prefix_length", minimum=0)
    s = check_int(suffix_length, "suffix_length", minimum=0)
    rings = concentric_rings(height, width, device=device)
    count = int(rings.max()) + 1
    return torch.cat(
        [
            torch.arange(p, device=device),
            p + rings.reshape(-1),
            torch.arange(p + count, p + count + s, device=device),
        ]
    )


def cca_mask_mod(positions: Tensor) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
    """FlexAttention ``mask_mod(b, h, q_idx, kv_idx)`` of CCA over ``positions (L,)`` or
    ``(B, L)`` from ``cca_positions``: ``pos[k] <= pos[q]`` (causal text, ring order in
    the image). Element-wise on broadcasting index tensors."""
    pos = check_int_tensor(positions, "positions")
    pos = pos if pos.dim() == 2 else pos[None]

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        bb = b if pos.shape[0] > 1 else torch.zeros_like(b)
        return pos[bb, kv_idx] <= pos[bb, q_idx]

    return mask_mod


def cca_mask(positions: Tensor) -> Tensor:
    """Dense bool mask ``(B|1, 1, L, L)`` of ``cca_mask_mod`` (True = attend) for
    ``relpos.attention(..., mask=...)`` with ``causal=False``. O(L^2) memory: for long
    sequences pass ``mask_mod=cca_mask_mod(positions)`` instead."""
    pos = check_int_tensor(positions, "positions")
    pos = pos if pos.dim() == 2 else pos[None]
    return pos[:, None, None, :] <= pos[:, None, :, None]


__all__ = ["concentric_rings", "cca_positions", "cca_mask_mod", "cca_mask"]
