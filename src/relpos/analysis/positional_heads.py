"""Positional heads: dimension-level analysis of rotary attention (Hong et al. 2024, "On the
Token Distance Modeling Ability of Higher RoPE Attention Dimension", arXiv 2410.08703; seed
113).

Authority C: no code was found; the metric is reconstructed (``shared/spec/remaining.md``
D2). The claim: correlating each RoPE dimension's share of the score with the token distance
identifies "positional heads", which put long-range attention on the high (low-frequency)
dimensions.

For rotated queries and keys ``q̃, k̃`` of one head, per rotary pair c (channels ``(2c, 2c+1)``
interleaved, ``(c, c + d/2)`` half-split):

    g_c(m, n) = q̃_{m,a} k̃_{n,a} + q̃_{m,b} k̃_{n,b}          (Σ_c g_c = q̃_m · k̃_n)
    ĉ(m, n)   = Σ_c c · softmax_c(g(m, n))                   (the dimension centroid)
    ρ_h       = Pearson correlation of ĉ with log(1 + m - n), weighted by the attention a_mn

over causal pairs; the positional heads are the top-k by ρ. Also reported: the share of |g|
on the upper half of the pairs (the low frequencies) for distances above a threshold.

Reference (q = k = 1, d = 16, base 10⁴: ``g_c(r) = 2 cos(r θ_c)``): the centroid at r = 0, 1, 4,
16, 64, 256, 1024 is ``3.5, 3.823, 4.3954, 4.7902, 4.4171, 4.3368, 3.6314``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from ..validation import check_choice, check_int

__all__ = [
    "HeadScores",
    "pair_contributions",
    "dimension_centroid",
    "head_scores",
    "encoding_head_scores",
    "plot_head_scores",
]


def pair_contributions(q: Tensor, k: Tensor, layout: str = "half") -> Tensor:
    """``g_c(m, n)`` for rotated ``q (..., Lq, d)``, ``k (..., Lk, d)``: ``(..., Lq, Lk, d/2)``."""
    check_choice(layout, "layout", ("half", "interleaved"))
    d = q.shape[-1]
    if d % 2 or k.shape[-1] != d:
        raise ValueError(f"q and k must have the same even head_dim, got {d} and {k.shape[-1]}")
    if layout == "interleaved":
        qa, qb, ka, kb = q[..., 0::2], q[..., 1::2], k[..., 0::2], k[..., 1::2]
    else:
        h = d // 2
        qa, qb, ka, kb = q[..., :h], q[..., h:], k[..., :h], k[..., h:]
    return qa[..., :, None, :] * ka[..., None, :, :] + qb[..., :, None, :] * kb[..., None, :, :]


def dimension_centroid(g: Tensor) -> Tensor:
    """``ĉ = Σ_c c · softmax_c(g)`` over the last axis."""
    c = torch.arange(g.shape[-1], dtype=g.dtype, device=g.device)
    return (torch.softmax(g, dim=-1) * c).sum(-1)


def _weighted_pearson(x: Tensor, y: Tensor, w: Tensor) -> float:
    w = w / w.sum()
    mx, my = (w * x).sum(), (w * y).sum()
    cov = (w * (x - mx) * (y - my)).sum()
    den = torch.sqrt((w * (x - mx) ** 2).sum() * (w * (y - my) ** 2).sum())
    return float(cov / den) if float(den) > 0 else 0.0


def head_scores(
    q: Tensor,
    k: Tensor,
    attention: Tensor,
    *,
    layout: str = "half",
    far: int | None = None,
) -> tuple[list[float], list[float]]:
    """ρ per head and the upper-half |g| share beyond distance ``far`` (default L/2).

    ``q, k (H, L, d)`` rotated (one sequence), ``attention (H, L, L)`` the weights.
    """
    H, L, _ = q.shape
    m = torch.arange(L)[:, None]
    n = torch.arange(L)[None, :]
    causal = n <= m
    logdist = torch.log1p((m - n).clamp(min=0).to(torch.float64))
    far = L // 2 if far is None else far
    rho, share = [], []
    for h in range(H):
        g = pair_contributions(q[h].double(), k[h].double(), layout)  # (L, L, d/2)
        cent = dimension_centroid(g)
        rho.append(_weighted_pearson(cent[causal], logdist[causal], attention[h].double()[causal]))
        sel = causal & ((m - n) > far)
        mag = g.abs()[sel]
        half = mag.shape[-1] // 2
        share.append(float(mag[:, half:].sum() / mag.sum()) if mag.numel() else math.nan)
    return rho, share


@dataclass
class HeadScores:
    """ρ (and the low-frequency share) per layer and head; the top-k positional heads."""

    label: str
    rho: list[list[float]]  # [layer][head]
    low_frequency_share: list[list[float]]
    top: list[tuple[int, int, float]]  # (layer, head, rho)
    centroid_profile: list[list[float]] | None = None  # head-mean E[ĉ] by distance bucket

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, label: str, rho, share, top_k: int) -> HeadScores:
        flat = [(li, h, r) for li, row in enumerate(rho) for h, r in enumerate(row)]
        flat.sort(key=lambda t: -t[2] if t[2] == t[2] else math.inf)
        return cls(label, rho, share, flat[: check_int(top_k, "top_k")])


def encoding_head_scores(
    encoding: Any, length: int, *, samples: int = 4, seed: int = 0, top_k: int = 4
) -> HeadScores:
    """ρ per head of a rotary encoding at initialisation: Gaussian q, k, their own softmax
    weights (causal), averaged over ``samples`` draws; one "layer"."""
    import relpos

    if not getattr(encoding, "has_rotary", False):
        raise ValueError(
            f"positional heads need a rotary encoding (pairs of rotated channels); "
            f"{encoding.name!r} is not one"
        )
    L = check_int(length, "length", minimum=2)
    samples = check_int(samples, "samples")
    layout = getattr(encoding, "layout", "half")
    H, D = encoding.num_heads, encoding.head_dim
    g = torch.Generator().manual_seed(check_int(seed, "seed", minimum=0))
    pos = torch.arange(L)[None]
    rho = torch.zeros(H, dtype=torch.float64)
    share = torch.zeros(H, dtype=torch.float64)
    mask = torch.ones(L, L, dtype=torch.bool).tril()
    with torch.no_grad():
        for _ in range(samples):
            q = torch.randn(1, H, L, D, generator=g)
            k = torch.randn(1, H, L, D, generator=g)
            qr, kr = encoding.rotate_qk(q, k, pos, pos)
            s = relpos.scores(q, k, encoding, q_pos=pos, k_pos=pos)[0].masked_fill(~mask, -math.inf)
            r, sh = head_scores(qr[0], kr[0], torch.softmax(s, -1), layout=layout)
            rho += torch.tensor(r, dtype=torch.float64)
            share += torch.tensor(sh, dtype=torch.float64)
    return HeadScores.of(
        encoding.name, [(rho / samples).tolist()], [(share / samples).tolist()], min(top_k, H)
    )


def plot_head_scores(results: list[HeadScores], path: Any) -> None:
    """ρ heat map (layer x head) per result."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .output import save_figure

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        im = ax.imshow(r.rho, aspect="auto", cmap="coolwarm", vmin=-1, vmax=1)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"{r.label}: ρ(centroid, log distance)", fontsize=9)
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    save_figure(fig, path)
