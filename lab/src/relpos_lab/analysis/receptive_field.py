"""Theoretical and effective receptive fields (Qin, Zhong & Deng, "Exploring Transformer
Extrapolation", AAAI 2024, arXiv 2307.10156).

Only the abstract was available (the official OpenNLPLab/Rpe could not be read): the claim is that a
transformer with a relative bias ``b(n)`` extrapolates when ``Σ_n exp(b(n))`` converges, and that
the *theoretical receptive field* (TRF), computed from the bias alone without training, tracks the
effective one. Reconstruction (not checked against the paper's code), per head h and a context of N
tokens:

    c_h(t)     = Σ_{n≤t} e^{b_h(n)} / Σ_{n<N} e^{b_h(n)}        (b_h(n): bias at distance n)
    TRF_ε(h,N) = min{t : c_h(t) ≥ 1 - ε}                        (ε = 0.01)

and the verdict "converges" when the TRF moves by less than 1% from N to 2N. ALiBi with slope
m gives ``ceil(ln(1/ε)/m) - 1`` (9, 73, 1178 for m = 1/2, 1/16, 1/256); ``-log(1+n)``
diverges (478, 949, 1886 at N = 512, 1024, 2048) and ``-2 log(1+n)`` converges (53, 56, 58).

The *effective* receptive field of a model (Chi et al.'s construction): the gradient of the
last token's loss with respect to the input embeddings, its norm per position, accumulated
from the last token backwards and normalised; the ERF is the smallest window holding
``1 - ε`` of it. ``model_receptive_field`` puts a model's ERF beside the TRF of the encoding
it holds (its trained parameters, per layer and head, at the ERF's length N): one point of
the TRF-against-ERF plot per model. The model's TRF is its widest head's (a layer's output
reads as far back as its widest head); the head range is kept too. Rotary and other
non-bias encodings have no TRF (``trf`` is None, the reason in ``note``).

Shapes: a bias table ``(H, N)`` over distances ``0..N-1``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from relpos.validation import check_float, check_int, check_int_sequence

__all__ = [
    "ReceptiveField",
    "cumulative_mass",
    "receptive_field",
    "distance_bias",
    "theoretical_receptive_field",
    "effective_receptive_field",
    "ModelField",
    "model_encodings",
    "model_receptive_field",
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


def model_encodings(model: Any) -> list[Any]:
    """The encoding of each attention layer of a relpos model (``MultiHeadAttention``
    modules, in order; None for a layer without one)."""
    from relpos.nn.attention import MultiHeadAttention

    layers = [m.encoding for m in model.modules() if isinstance(m, MultiHeadAttention)]
    if not layers:
        raise ValueError("the model has no relpos MultiHeadAttention layers")
    return layers


@dataclass
class ModelField:
    """A model's ERF beside the TRF of its own encoding at the same length N.

    ``trf``: ``[layer][head]`` (None when the encoding has no distance-only bias: ``note``
    says why); ``trf_max`` / ``trf_min``: the widest and narrowest head over all layers (the
    model's TRF is ``trf_max``); ``half`` / ``ninety``: the windows holding 50% / 90% of the
    gradient mass."""

    label: str
    encoding: str
    length: int
    texts: int
    epsilon: float
    erf: int
    mass: list[float]
    trf: list[list[int]] | None
    trf_max: int | None
    trf_min: int | None
    note: str = ""
    #: windows holding 50% and 90% of the gradient mass (where the ERF at eps saturates)
    half: int = 0
    ninety: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_receptive_field(
    model: Any, tokens: Tensor, label: str, epsilon: float = 0.01
) -> ModelField:
    """ERF of ``model`` on ``tokens (B, N + 1)`` and the TRF of its layers' encodings at N."""
    mass, erf = effective_receptive_field(model, tokens, epsilon)
    length = tokens.shape[1] - 1
    encodings = model_encodings(model)
    names = sorted({e.name for e in encodings if e is not None}) or ["none"]
    trf: list[list[int]] | None = []
    note = ""
    for enc in encodings:
        if enc is None:  # no encoding in attention (absolute or none): a uniform bias of 0
            trf.append(receptive_field(cumulative_mass(torch.zeros(1, length)), epsilon).tolist())
            continue
        try:
            table = distance_bias(enc, length)
        except ValueError as err:
            trf, note = None, str(err)
            break
        trf.append(receptive_field(cumulative_mass(table), epsilon).tolist())
    flat = [v for row in trf for v in row] if trf is not None else []
    return ModelField(
        label=label,
        encoding=",".join(names),
        length=length,
        texts=tokens.shape[0],
        epsilon=float(epsilon),
        erf=erf,
        mass=mass,
        trf=trf,
        trf_max=max(flat) if flat else None,
        trf_min=min(flat) if flat else None,
        note=note,
        half=int(receptive_field(torch.tensor(mass), 0.5)),
        ninety=int(receptive_field(torch.tensor(mass), 0.1)),
    )


def plot_receptive_field(
    result: ReceptiveField, path: Any, fields: list[ModelField] | None = None
) -> None:
    """``c_h(t)`` against log t per head with the 1 - ε line (and each model's ERF mass), the
    TRF per head at each N, and with models the TRF against the ERF (one point per model,
    the bar spanning its heads' TRFs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..io import save_figure

    fields = fields or []
    panels = 3 if fields else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4))
    ax, bx = axes[0], axes[1]
    t = [w + 1 for w in result.window]
    for h, m in enumerate(result.mass):
        ax.plot(t, m, label=f"head {h}" if len(result.mass) <= 8 else None)
    for f in fields:
        ax.plot(range(1, len(f.mass) + 1), f.mass, "--", label=f"ERF mass: {f.label}")
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
    if fields:
        cx = axes[2]
        top = max([f.length for f in fields]) or 1
        cx.plot([1, top], [1, top], color="grey", lw=0.8, label="ERF = TRF")
        for f in fields:
            if f.trf_max is None:
                continue
            lo, hi = max(f.trf_min, 1), max(f.trf_max, 1)
            cx.errorbar(
                [hi], [max(f.erf, 1)], xerr=[[hi - lo], [0]], fmt="o", capsize=3, label=f.label
            )
        cx.set_xscale("log")
        cx.set_yscale("log")
        cx.set_xlabel(f"TRF of the model's encoding (widest head; bar: heads), N = {top}")
        cx.set_ylabel("ERF (gradient mass)")
        cx.set_title("TRF against ERF", fontsize=9)
        cx.legend(fontsize=6)
    fig.tight_layout()
    save_figure(fig, path)
