"""Attention resolution (Sun et al. 2022, "A Length-Extrapolatable Transformer", arXiv
2212.10554; the formula is as recalled, not re-verified against the paper text).

For expected scores ``s[0..N]`` at distances ``0..N``, assumed decreasing,

    R(s) = sum_i e^{s[i]} (e^{s[i]} - e^{s[i+1]}) / (sum_{i=0}^{N} e^{s[i]})^2
         = sum_i p_i (p_i - p_{i+1}),   p = softmax(s).

The paper uses ``R`` as an extrapolation diagnostic: attention that falls off monotonically and
sharply with distance has a high resolution; xPos was designed to raise it.

Assumptions (the formula as quoted sums ``i = 0..N`` but ``s[N+1]`` does not exist): the
differences run over the ``N`` neighbouring pairs ``i = 0..N-1`` and the normaliser over all
``N + 1`` scores, so ``R`` is 0 for flat scores (attention blind to distance) and 1 for
attention on distance 0 only; it is invariant to adding a constant to ``s``. For an encoding,
``s[i]`` is the expected logit at distance ``i`` of a query and a similar key (``k = q``, ``q ~
N(0, I)``; Monte Carlo over ``samples`` draws; scale and biases included, see
``decay.expected_logits``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from relpos.encodings.base import Encoding
from relpos.validation import check_float, check_int

from ..io import save_figure
from .decay import expected_logits, sample_count

__all__ = ["attention_resolution", "Resolution", "encoding_resolution", "plot_resolution"]


def attention_resolution(scores: Tensor) -> Tensor:
    """``R(s)`` along the last axis of ``scores (..., N + 1)`` (distances ``0..N``), float64.

    ``-inf`` scores are allowed (zero weight); at least two distances are needed.
    """
    if not isinstance(scores, Tensor):
        raise TypeError(f"scores must be a torch.Tensor, got {type(scores).__name__}")
    if scores.dim() == 0 or scores.shape[-1] < 2:
        raise ValueError(
            f"scores must have shape (..., N + 1) with N + 1 >= 2 distances, got "
            f"{tuple(scores.shape)}"
        )
    if not scores.is_floating_point():
        raise TypeError(f"scores must be a floating-point tensor, got {scores.dtype}")
    if torch.isnan(scores).any() or (scores == float("inf")).any():
        raise ValueError("scores must not contain NaN or +inf")
    p = torch.softmax(scores.to(torch.float64), dim=-1)
    return (p[..., :-1] * (p[..., :-1] - p[..., 1:])).sum(-1)


@dataclass(frozen=True)
class Resolution:
    """Attention resolution of one encoding at each of ``lengths`` (``R`` over distances
    ``0..L-1``), from the expected logits ``expected_logit[0..max(lengths)-1]``."""

    encoding: str
    num_heads: int
    head_dim: int
    lengths: list[int]
    resolution: list[float]
    expected_logit: list[float]
    samples: int
    key_correlation: float
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def encoding_resolution(
    encoding: Encoding,
    lengths: Sequence[int] = (512, 1024, 2048, 4096),
    *,
    samples: int = 256,
    key_correlation: float = 1.0,
    seed: int = 0,
) -> Resolution:
    """``R`` of ``encoding``'s expected logits over the distances ``0..L-1`` of each length."""
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence) or not lengths:
        raise ValueError(f"lengths must be a non-empty sequence of ints >= 2, got {lengths!r}")
    lengths = [check_int(n, "lengths", minimum=2) for n in lengths]
    rho = check_float(key_correlation, "key_correlation", minimum=-1.0, maximum=1.0)
    s = expected_logits(encoding, max(lengths) - 1, samples=samples, key_correlation=rho, seed=seed)
    values = [float(attention_resolution(s[:n])) for n in lengths]
    return Resolution(
        encoding=encoding.name or type(encoding).__name__,
        num_heads=encoding.num_heads,
        head_dim=encoding.head_dim,
        lengths=lengths,
        resolution=values,
        expected_logit=s.tolist(),
        samples=sample_count(samples, encoding.head_dim, rho),
        key_correlation=rho,
        seed=seed,
    )


def plot_resolution(results: Sequence[Resolution], path: str | Path) -> None:
    """Expected logit vs distance and resolution vs length, one line per encoding (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not results:
        raise ValueError("results must not be empty")
    fig, (ax_s, ax_r) = plt.subplots(1, 2, figsize=(11.0, 4.2))
    colors = plt.get_cmap("tab10")
    for n, r in enumerate(results):
        color = colors(n % 10)
        ax_s.plot(
            range(len(r.expected_logit)),
            r.expected_logit,
            color=color,
            linewidth=0.8,
            label=r.encoding,
        )
        ax_r.plot(r.lengths, r.resolution, "o-", color=color, markersize=3.5, label=r.encoding)
    ax_s.set_xlabel("distance")
    ax_s.set_ylabel("expected logit (similar key)")
    ax_s.set_title("expected logit s[i] vs distance", fontsize=10)
    ax_r.set_xscale("log", base=2)
    ax_r.set_xlabel("length N + 1 (distances 0..N)")
    ax_r.set_ylabel("R(s)")
    ax_r.set_title("attention resolution (Sun et al. 2022)", fontsize=10)
    for ax in (ax_s, ax_r):
        ax.grid(True, alpha=0.25)
        ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    save_figure(fig, path)
