"""Phase sensitivity of chunked KV-cache compression (known from an abstract only; the paper
was not located).

The abstract's claim: compressing the cache in windows of stride s gives every token a
*phase*, its offset from the window boundary, ``φ(p) = (p - offset) mod s``; retrieval then
varies periodically with the needle's phase (by up to 40 points in open models), so
evaluations of compressed caches must sweep the phase.

The harness sanity kernel (constructed for relpos, computed here
through the encoding's own ``rotate``): pool the window's keys *before* RoPE and rotate the
pooled key at a reference phase ``φ_r`` (a window position, fractional allowed); a query
that matches the needle, placed at the needle's position, then scores

    S(φ) = score(q at φ, pooled key rotated at φ_r) / score(q at φ, key at φ)
         = (2/d) Σ_c cos((φ - φ_r) θ_c)          (RoPE, q = k with equal energy per channel)

relative to the uncompressed cache; pooling *after* RoPE gives S ≡ 1. Reference (d = 64,
base 10⁴): s = 4, φ_r = 0: ``[1, 0.966151, 0.884496, 0.799595]``; φ_r = 1.5:
``[0.928733, 0.991193, 0.991193, 0.928733]``.

``phase_gap`` = max_φ S - min_φ S (per head), the kernel's analogue of the accuracy gap.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from relpos.validation import check_choice, check_float, check_int

__all__ = ["PhaseSensitivity", "phase_scores", "phase_sensitivity", "plot_phase"]

POOLS = ("before", "after")


def phase_scores(
    encoding: Any, stride: int, reference_phase: float = 0.0, *, pool: str = "before"
) -> Tensor:
    """``S(φ)`` for φ = 0..stride-1, per head: ``(H, stride)`` float64."""
    stride = check_int(stride, "stride")
    reference_phase = check_float(reference_phase, "reference_phase")
    check_choice(pool, "pool", POOLS)
    if not getattr(encoding, "has_rotary", False):
        raise ValueError(
            f"phase sensitivity needs a rotary encoding (its keys are rotated by position); "
            f"{encoding.name!r} is not one"
        )
    H, D = encoding.num_heads, encoding.head_dim
    x = torch.full((1, H, stride, D), D**-0.5, dtype=torch.float64)  # q = k, |q| = 1
    phases = torch.arange(stride, dtype=torch.float64)

    def positions(values: Tensor) -> Tensor:
        pos = values[None]
        dims = getattr(encoding, "dims", 1)
        return pos[..., None].expand(1, stride, dims) if dims > 1 else pos

    with torch.no_grad():
        enc = copy.deepcopy(encoding).double()
        q, k_true = enc.rotate_qk(x, x, positions(phases), positions(phases))
        if pool == "before":
            reference = positions(torch.full_like(phases, reference_phase))
            _, k = enc.rotate_qk(x, x, positions(phases), reference)
        else:
            k = k_true
        exact = (q * k_true).sum(-1)
        compressed = (q * k).sum(-1)
    return (compressed / exact)[0]


@dataclass
class PhaseSensitivity:
    """``S(φ)`` per head for one encoding, stride and reference phase."""

    encoding: str
    stride: int
    reference_phase: float
    pool: str
    scores: list[list[float]]  # [head][phase]
    phase_gap: list[float]  # per head

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def phase_sensitivity(
    encoding: Any, stride: int, reference_phase: float = 0.0, *, pool: str = "before"
) -> PhaseSensitivity:
    s = phase_scores(encoding, stride, reference_phase, pool=pool)
    return PhaseSensitivity(
        encoding=encoding.name,
        stride=int(stride),
        reference_phase=float(reference_phase),
        pool=pool,
        scores=s.tolist(),
        phase_gap=(s.amax(1) - s.amin(1)).tolist(),
    )


def plot_phase(results: list[PhaseSensitivity], path: Any) -> None:
    """Head-mean ``S(φ)`` against phase per setting (bars), and the per-head gap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..io import save_figure

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(results)
    for n, r in enumerate(results):
        mean = torch.tensor(r.scores).mean(0)
        label = f"{r.encoding} s={r.stride} φr={r.reference_phase:g} ({r.pool})"
        ax.bar([p + n * width for p in range(r.stride)], mean.tolist(), width, label=label)
        bx.plot(range(len(r.phase_gap)), r.phase_gap, marker="o", label=label)
    ax.set_xlabel("needle phase φ")
    ax.set_ylabel("score relative to the uncompressed cache")
    ax.legend(fontsize=7)
    bx.set_xlabel("head")
    bx.set_ylabel("phase gap max S - min S")
    bx.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
