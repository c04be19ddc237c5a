"""Float64 formulas and small helpers shared by the rotary encoding tests (from the papers and
official code, never from relpos)."""

from __future__ import annotations

import torch

import relpos


def randn(*shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def ones_scores(enc, length: int, head_dim: int) -> torch.Tensor:
    """Score of an all-ones query at distance ``0 .. length-1`` from an all-ones key at 0."""
    q = torch.ones(1, 1, length, head_dim)
    k = torch.ones(1, 1, 1, head_dim)
    out = relpos.scores(q, k, enc, q_pos=torch.arange(length), k_pos=torch.tensor([0]), scale=1.0)
    return out[0, 0, :, 0].double()


def rope_fp64(
    x: torch.Tensor, pos: torch.Tensor, theta: torch.Tensor, layout: str, float32_angles=False
):
    """RoPE in float64 from the formula : pair (a, b) -> (a c - b s, a s + b c);
    ``float32_angles``: the angles ``p theta`` rounded to float32 first (as HF does)."""
    x = x.double()
    ang = pos.double()[:, None] * theta.double()  # (L, F)
    if float32_angles:
        ang = ang.float().double()
    c, s = ang.cos(), ang.sin()
    f = theta.numel()
    if layout == "half":
        a, b = x[..., :f], x[..., f:]
        return torch.cat((a * c - b * s, a * s + b * c), dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)


def theta_fp64(d: int, base: float = 1e4) -> torch.Tensor:
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
