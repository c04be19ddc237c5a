"""Theoretical and effective receptive fields (Qin, Zhong & Deng, "Exploring Transformer
Extrapolation", AAAI 2024, arXiv 2307.10156; seed 23).

Authority C (abstract; OpenNLPLab/Rpe not reachable): the claim is that a transformer with a
relative bias ``b(n)`` extrapolates when ``Σ_n exp(b(n))`` converges, and that the
*theoretical receptive field* (TRF), computed from the bias alone without training, tracks
the effective one. Reconstruction (``shared/spec/remaining.md`` D1), per head h and a
context of N tokens:

    c_h(t)     = Σ_{n≤t} e^{b_h(n)} / Σ_{n<N} e^{b_h(n)}        (b_h(n): bias at distance n)
    TRF_ε(h,N) = min{t : c_h(t) ≥ 1 - ε}                        (ε = 0.01)

and the verdict "converges" when the TRF moves by less than 1% from N to 2N. ALiBi with slope
m gives ``ceil(ln(1/ε)/m) - 1`` (9, 73, 1178 for m = 1/2, 1/16, 1/256); ``-log(1+n)``
diverges (478, 949, 1886 at N = 512, 1024, 2048) and ``-2 log(1+n)`` converges (53, 56, 58).

The *effective* receptive field of a model (Chi et al.'s construction): the gradient of the
last token's loss with respect to the input embeddings, its norm per position, accumulated
from the last token backwards and normalised; the ERF is the smallest window holding
``1 - ε`` of it.

Shapes: a bias table ``(H, N)`` over distances ``0..N-1``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..validation import check_float, check_int, check_int_sequence

__all__ = [
    "ReceptiveField",
    "cumulative_mass",
    "receptive_field",
    "distance_bias",
    "theoretical_receptive_field",
    "effective_receptive_field",
    "plot_receptive_field",
]


def cumulative_mass(bias: Tensor) -> Tensor:
    """``c_h(t)`` for a bias table ``(H, N)`` (float64, log-sum-exp stable): ``(H, N)``."""
    if not isinstance(bias, Tensor) or bias.dim() != 2 or bias.shape[1] == 0:
        raise ValueError("bias must be a tensor of shape (H, N) with N >= 1")
    b = bias.to(torch.float64)
    if bool(torch.isnan(b).any()):
        raise ValueError("bias must not contain NaN")
    return torch.exp(torch.logcumsumexp(b, dim=1) - torch.logsumexp(b, dim=1, keepdim=True))


def receptive_field(mass: Tensor, epsilon: float = 0.01) -> Tensor:
    """``min{t : mass[..., t] >= 1 - epsilon}`` for a cumulative mass ``(..., N)``: int64."""
    epsilon = check_float(epsilon, "epsilon", above=0.0, below=1.0)
    reached = mass >= (1.0 - epsilon) * (1 - 1e-12)  # c(N-1) = 1 up to rounding
    return reached.to(torch.int64).argmax(dim=-1)


def distance_bias(encoding: Any, length: int) -> Tensor:
    """``b_h(n)`` for n = 0..length-1 (``distance_table``), ``(H, length)``; zeros for an
    encoding without any score term (NoPE). Refuses encodings whose bias is not a function of
    the distance alone, or that rotate (their position effect is not a bias)."""
    length = check_int(length, "length")
    if getattr(encoding, "has_rotary", False) or not (
        getattr(encoding, "distance_only", False) or not getattr(encoding, "has_bias", False)
    ):
        raise ValueError(
            f"the receptive field needs a distance-only bias encoding (alibi, t5, kerple-log, "
            f"sandwich, ...); {encoding.name!r} is not one"
        )
    if not encoding.has_bias:
        return torch.zeros(encoding.num_heads, length, dtype=torch.float64)
    with torch.no_grad():
        return encoding.distance_table(0, length - 1, torch.device("cpu")).to(torch.float64)


@dataclass
class ReceptiveField:
    """TRF per head at each length, the verdict per head, and ``c_h(t)`` at the largest."""

    encoding: str
    epsilon: float
    lengths: list[int]
    trf: list[list[int]]  # [length][head]
    doubled: list[int]  # TRF per head at 2 x the largest length (for the verdict)
    converges: list[bool]  # per head
    window: list[int] = field(default_factory=list)  # t (log-spaced) where mass is sampled
    mass: list[list[float]] = field(default_factory=list)  # [head][i]: c_h(window[i]), largest N

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def theoretical_receptive_field(
    encoding: Any, lengths: list[int] | tuple[int, ...], epsilon: float = 0.01
) -> ReceptiveField:
    """The TRF of a distance-only bias encoding at each length (and its verdict)."""
    lengths = sorted(set(check_int_sequence(lengths, "lengths")))
    epsilon = check_float(epsilon, "epsilon", above=0.0, below=1.0)
    largest = lengths[-1]
    table = distance_bias(encoding, 2 * largest)
    trf = [receptive_field(cumulative_mass(table[:, :n]), epsilon).tolist() for n in lengths]
    doubled = receptive_field(cumulative_mass(table), epsilon).tolist()
    converges = [abs(d - t) < 0.01 * max(t, 1) for t, d in zip(trf[-1], doubled, strict=True)]
    window = torch.unique(torch.logspace(0, math.log10(largest), 256).round().long() - 1)
    mass = cumulative_mass(table[:, :largest])[:, window]
    return ReceptiveField(
        encoding=encoding.name,
        epsilon=epsilon,
        lengths=lengths,
        trf=trf,
        doubled=doubled,
        converges=converges,
        window=window.tolist(),
        mass=mass.tolist(),
    )


def effective_receptive_field(
    model: Any, tokens: Tensor, epsilon: float = 0.01
) -> tuple[list[float], int]:
    """ERF of a language model: ``tokens (B, N + 1)``; the loss of predicting token N from
    the first N. Returns (the cumulative normalised gradient mass over the window size
    t = 0..N-1, counted back from the last input token; the ERF)."""
    epsilon = check_float(epsilon, "epsilon", above=0.0, below=1.0)
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.shape[1] < 2:
        raise ValueError("tokens must be an int tensor of shape (B, N + 1) with N >= 1")
    captured: dict[str, Tensor] = {}

    def keep(_module, _inputs, output):
        output.retain_grad()
        captured["embeddings"] = output

    handle = model.embed.register_forward_hook(keep)
    try:
        model.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits[:, -1].float(), tokens[:, -1])
        loss.backward()
    finally:
        handle.remove()
    grad = captured["embeddings"].grad.float().norm(dim=-1).sum(0)  # (N,)
    back = grad.flip(0).double()
    mass = torch.cumsum(back, 0) / back.sum().clamp(min=1e-300)
    return mass.tolist(), int(receptive_field(mass, epsilon))


def plot_receptive_field(result: ReceptiveField, path: Any, erf: list[float] | None = None) -> None:
    """``c_h(t)`` against log t per head, with the 1 - ε line (and the model's ERF mass)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .output import save_figure

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    t = [w + 1 for w in result.window]
    for h, m in enumerate(result.mass):
        ax.plot(t, m, label=f"head {h}" if len(result.mass) <= 8 else None)
    if erf is not None:
        ax.plot(range(1, len(erf) + 1), erf, "k--", label="model ERF mass")
    ax.axhline(1 - result.epsilon, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("window t (tokens back)")
    ax.set_ylabel("c_h(t)")
    ax.set_title(f"{result.encoding}: cumulative bias mass")
    ax.legend(fontsize=7)
    heads = len(result.trf[0])
    width = 0.8 / len(result.lengths)
    for n, (length, row) in enumerate(zip(result.lengths, result.trf, strict=True)):
        bx.bar(
            [h + n * width for h in range(heads)],
            [max(v, 1) for v in row],
            width,
            label=f"N={length}",
        )
    bx.set_yscale("log")
    bx.set_xlabel("head")
    bx.set_ylabel(f"TRF (eps={result.epsilon:g})")
    bx.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
