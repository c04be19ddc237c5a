"""The causal mask as positional information (Kim et al. 2025, "Behind RoPE: How Does Causal
Mask Encode Positional Information?"; official code starmpcc/causal_mask_encodes_positional,
``concept/simulation*.ipynb``, read). With
no parameters at all, a causal residual attention layer makes the next layer's scores depend
on the positions (nearby pairs score higher); combined with RoPE it makes RoPE's pattern
non-relative.

Simulation (the official notebooks' parameter-free residual layer), per layer:

    h = x / ‖x‖,  scores = h hᵀ  (RoPE-rotated h for the RoPE variant),
    out = softmax(scores + causal) h + x

with inputs ``normalize(ε_tok + l ε_seq)``, ``l = sqrt(α / (1 - α))`` (ε_tok per token,
ε_seq shared by a sequence; official sizes B = 100000, S = 50, E = 64, 4 layers). The value
path is unrotated in the RoPE variant (an assumption: the rotation acts on the scores).

Measures, per layer l, on the lower triangle (δ = i - j ≥ 0):

    S̄_l          the mean pre-softmax score map (over the batch and heads)
    D_l[i, i-δ]  = S̄_l[i, i-δ] - mean_i S̄_l[i, i-δ]         (the diagonal normalisation)
    NR_l         = ‖D_l‖_F / ‖S̄_l - mean(S̄_l)‖_F            (0 for an exactly relative map)

Reference (paper Fig. 1): orthonormal inputs, N = 3, one layer: the next layer's scores are
``[[1], [0.1535, 1], [0.1321, 0.1508, 1]]``; the diagonal residuals are ±0.00135 on δ = 1.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from relpos.validation import check_bool, check_float, check_int

__all__ = [
    "ScoreMaps",
    "residual_layer",
    "simulate_scores",
    "diagonal_residual",
    "non_relativity",
    "plot_score_maps",
]


def _rotate(h: Tensor, encoding: Any | None) -> Tensor:
    if encoding is None:
        return h
    pos = torch.arange(h.shape[1])[None]
    return encoding.rotate(h[:, None], pos, "q")[:, 0]


def layer_scores(x: Tensor, encoding: Any | None = None) -> Tensor:
    """Pre-softmax scores ``h hᵀ`` of ``x (B, S, E)``, h = x/‖x‖ (rotated when an encoding
    is given): ``(B, S, S)``."""
    h = x / x.norm(dim=-1, keepdim=True)
    r = _rotate(h, encoding)
    return r @ r.transpose(-1, -2)


def residual_layer(x: Tensor, encoding: Any | None = None, *, causal: bool = True) -> Tensor:
    """``softmax(scores + causal) h + x`` for ``x (B, S, E)``."""
    h = x / x.norm(dim=-1, keepdim=True)
    s = layer_scores(x, encoding)
    if causal:
        S = x.shape[1]
        s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), -math.inf)
    return torch.softmax(s, dim=-1) @ h + x


def simulate_scores(
    layers: int = 4,
    *,
    batch: int = 2000,
    seq: int = 50,
    dim: int = 64,
    alpha: float = 0.5,
    encoding: Any | None = None,
    causal: bool = True,
    seed: int = 0,
    inputs: Tensor | None = None,
) -> list[Tensor]:
    """Mean score maps ``S̄_l (S, S)`` for l = 1..layers+1 (the input of each layer and the
    output of the last), float64. ``inputs (B, S, E)`` overrides the random draw."""
    layers = check_int(layers, "layers")
    check_bool(causal, "causal")
    if inputs is None:
        batch, seq, dim = check_int(batch, "batch"), check_int(seq, "seq"), check_int(dim, "dim")
        alpha = check_float(alpha, "alpha", minimum=0.0, below=1.0)
        g = torch.Generator().manual_seed(check_int(seed, "seed", minimum=0))
        tok = torch.randn(batch, seq, dim, generator=g, dtype=torch.float64)
        shared = torch.randn(batch, 1, dim, generator=g, dtype=torch.float64)
        x = tok + math.sqrt(alpha / (1 - alpha)) * shared
        x = x / x.norm(dim=-1, keepdim=True)
    else:
        x = inputs.to(torch.float64)
    maps = []
    with torch.no_grad():
        for _ in range(layers):
            maps.append(layer_scores(x, encoding).mean(0))
            x = residual_layer(x, encoding, causal=causal)
        maps.append(layer_scores(x, encoding).mean(0))
    return maps


def _lower(n: int) -> Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


def diagonal_residual(scores: Tensor) -> Tensor:
    """``D[i, i-δ] = S̄[i, i-δ] - mean_i S̄[i, i-δ]`` on the lower triangle (0 above)."""
    if not isinstance(scores, Tensor) or scores.dim() != 2 or scores.shape[0] != scores.shape[1]:
        raise ValueError("scores must be a square (N, N) tensor")
    N = scores.shape[0]
    s = scores.to(torch.float64)
    out = torch.zeros_like(s)
    for delta in range(N):
        diag = torch.diagonal(s, offset=-delta)
        out.diagonal(offset=-delta).copy_(diag - diag.mean())
    return out


def non_relativity(scores: Tensor) -> float:
    """``NR = ‖D‖_F / ‖S̄ - mean‖_F`` over the lower triangle (0: exactly relative)."""
    low = _lower(scores.shape[0])
    s = scores.to(torch.float64)[low]
    spread = (s - s.mean()).norm()
    if float(spread) == 0.0:
        return 0.0
    return float(diagonal_residual(scores)[low].norm() / spread)


@dataclass
class ScoreMaps:
    """Mean score maps and their non-relativity per layer, for one setting."""

    label: str
    causal: bool
    maps: list[list[list[float]]]
    non_relativity: list[float]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, label: str, causal: bool, maps: list[Tensor]) -> ScoreMaps:
        return cls(label, causal, [m.tolist() for m in maps], [non_relativity(m) for m in maps])


def plot_score_maps(results: list[ScoreMaps], path: Any) -> None:
    """S̄_l and D_l heat maps of the first setting (quantile colour limits), NR_l of all."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..io import save_figure

    first = results[0]
    n = len(first.maps)
    fig, axes = plt.subplots(3, n, figsize=(2.6 * n, 8), squeeze=False)
    for col, m in enumerate(first.maps):
        s = torch.tensor(m)
        low = _lower(s.shape[0])
        for row, data in ((0, s), (1, diagonal_residual(s))):
            vals = data[low]
            lo, hi = torch.quantile(vals, 0.01).item(), torch.quantile(vals, 0.99).item()
            shown = data.masked_fill(~low, float("nan"))
            axes[row][col].imshow(shown.numpy(), vmin=lo, vmax=hi, cmap="viridis")
            axes[row][col].set_title(f"{'S' if row == 0 else 'D'} layer {col}", fontsize=8)
            axes[row][col].axis("off")
        axes[2][col].axis("off")
    ax = fig.add_subplot(3, 1, 3)
    for r in results:
        ax.plot(range(len(r.non_relativity)), r.non_relativity, marker="o", label=r.label)
    ax.set_xlabel("layer")
    ax.set_ylabel("non-relativity NR")
    ax.legend(fontsize=7)
    fig.suptitle(f"{first.label}: mean scores and diagonal residuals")
    fig.tight_layout()
    save_figure(fig, path)
