"""Position bias of attention as a graph quantity: the positional influence profile (Wu et al.,
"On the Emergence of Position Bias in Transformers", ICML 2025).

The setting follows the official code (xinyiwu98/position-bias-in-attention: its masks and the
rollout); the theory is from the paper, not checked. Masks are graphs; composing L layers of
attention is a walk of length L on them, so causal masking piles the influence of deep layers on the
first tokens, and decay masks or RoPE trade recency at one layer against that accumulation.

    A_l     = head-mean attention of layer l        (N, N), rows sum to 1
    R_t     = A_t ··· A_1        or, with the residual stream, Π (A_l + I) / 2
    ψ_t(j)  = [R_t]_{N-1, j}     the influence of token j on the last token after t layers

Reported: the first-token mass ψ_t(0) and the middle mass Σ_{N/4 ≤ j < 3N/4} ψ_t(j).

Attention from an encoding at initialisation: ``softmax(b + mask)`` for bias encodings
(q = k = 0: the bias alone); for rotary encodings the mean over i.i.d. Gaussian q, k of
``softmax(q R k / sqrt(d) + mask)`` (Monte Carlo, ``samples`` draws). The official code's masks
are ``full``, ``causal``, ``window`` (the last ``width`` keys), ``prefix`` (the first ``width``
tokens see each other) and ``decay`` (``log γ^{i-j}``: ALiBi with slope ``-ln γ``).
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from relpos.validation import check_bool, check_choice, check_float, check_int

__all__ = [
    "MASKS",
    "InfluenceProfile",
    "mask_attention",
    "encoding_attention",
    "rollout",
    "influence_profile",
    "plot_influence",
]

MASKS = ("full", "causal", "window", "prefix", "decay")


def mask_attention(kind: str, length: int, *, width: int = 2, gamma: float = 0.5) -> Tensor:
    """Uniform attention over a mask graph (``decay``: weights ``γ^{i-j}``), (N, N) float64."""
    check_choice(kind, "mask", MASKS)
    N = check_int(length, "length")
    i = torch.arange(N)[:, None]
    j = torch.arange(N)[None, :]
    if kind == "full":
        logits = torch.zeros(N, N, dtype=torch.float64)
    else:
        allowed = j <= i
        if kind == "window":
            allowed = allowed & (i - j < check_int(width, "width"))
        if kind == "prefix":
            allowed = allowed | ((i < check_int(width, "width")) & (j < width))
        logits = torch.where(allowed, 0.0, -math.inf).to(torch.float64)
        if kind == "decay":
            gamma = check_float(gamma, "gamma", above=0.0, maximum=1.0)
            logits = logits + (i - j).clamp(min=0) * math.log(gamma)
    return torch.softmax(logits, dim=-1)


def encoding_attention(
    encoding: Any,
    length: int,
    *,
    causal: bool = True,
    samples: int = 64,
    seed: int = 0,
) -> Tensor:
    """Head-mean attention of ``encoding`` at initialisation over N tokens, (N, N) float64."""
    import relpos

    N = check_int(length, "length")
    samples = check_int(samples, "samples")
    check_bool(causal, "causal")
    H, D = encoding.num_heads, encoding.head_dim
    draws = samples if encoding.has_rotary else 1
    g = torch.Generator().manual_seed(check_int(seed, "seed", minimum=0))
    pos = torch.arange(N)[None]
    if getattr(encoding, "dims", 1) > 1:
        pos = pos[..., None].expand(1, N, encoding.dims)
    total = torch.zeros(N, N, dtype=torch.float64)
    mask = torch.ones(N, N, dtype=torch.bool).tril() if causal else None
    encoding = copy.deepcopy(encoding).double()  # float64 work; the caller's is untouched
    with torch.no_grad():
        for _ in range(draws):
            if encoding.has_rotary:
                q = torch.randn(1, H, N, D, generator=g, dtype=torch.float64)
                k = torch.randn(1, H, N, D, generator=g, dtype=torch.float64)
            else:
                q = k = torch.zeros(1, H, N, D, dtype=torch.float64)
            s = relpos.scores(q, k, encoding, q_pos=pos, k_pos=pos)[0]
            if mask is not None:
                s = s.masked_fill(~mask, -math.inf)
            total += torch.softmax(s, dim=-1).mean(0)
    return total / draws


def rollout(attention: Tensor | list[Tensor], depth: int, *, residual: bool = False) -> Tensor:
    """``ψ_t = [A_t ··· A_1]_{N-1, :}`` for t = 1..depth: ``(depth, N)``.

    ``attention``: one (N, N) matrix used at every layer, or a list of per-layer matrices (its
    length is the depth then). ``residual``: ``(A + I) / 2`` per layer.
    """
    layers = list(attention) if isinstance(attention, (list, tuple)) else None
    depth = len(layers) if layers is not None else check_int(depth, "depth")
    if layers is None:
        layers = [attention] * depth
    N = layers[0].shape[-1]
    eye = torch.eye(N, dtype=torch.float64)
    R = eye
    rows = []
    for A in layers:
        A = A.to(torch.float64)
        if residual:
            A = (A + eye) / 2
        R = A @ R
        rows.append(R[-1])
    return torch.stack(rows)


@dataclass
class InfluenceProfile:
    """``psi[t-1][j]`` for t = 1..depth; first-token and middle mass per depth."""

    label: str
    length: int
    residual: bool
    psi: list[list[float]]
    first_token: list[float]
    middle: list[float]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def influence_profile(
    label: str, attention: Tensor | list[Tensor], depth: int, *, residual: bool = False
) -> InfluenceProfile:
    """The profile of one attention matrix (or per-layer list) rolled out over ``depth``."""
    psi = rollout(attention, depth, residual=residual)
    N = psi.shape[1]
    middle = psi[:, N // 4 : (3 * N) // 4].sum(1)
    return InfluenceProfile(
        label=label,
        length=N,
        residual=residual,
        psi=psi.tolist(),
        first_token=psi[:, 0].tolist(),
        middle=middle.tolist(),
    )


def plot_influence(profiles: list[InfluenceProfile], path: Any) -> None:
    """ψ_t(j) at the last depth per profile, and the first-token mass against depth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..io import save_figure

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for p in profiles:
        ax.plot(range(p.length), p.psi[-1], label=f"{p.label} (t={len(p.psi)})")
        bx.plot(range(1, len(p.first_token) + 1), p.first_token, marker="o", label=p.label)
    ax.set_xlabel("token j")
    ax.set_ylabel("influence on the last token ψ_t(j)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    bx.set_xlabel("depth t")
    bx.set_ylabel("first-token mass ψ_t(0)")
    bx.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
