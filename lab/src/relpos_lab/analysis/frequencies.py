"""Frequencies and wavelengths of RoPE under any frequency scaling.

For pair ``i`` the inverse frequency is ``theta_i`` (``relpos.functional.rope_frequencies``
with a Hugging Face ``rope_scaling`` dict) and the wavelength is ``lambda_i = 2 pi / theta_i``
tokens: pairs whose wavelength exceeds the training
context never complete a turn during training, which is what context-extension methods
(PI, NTK, YaRN, Llama 3, LongRoPE) rescale and p-RoPE removes (zero frequency, infinite
wavelength). ``scaling_presets`` gives one dict per type for a common ``factor`` and
``original`` length, to compare them on one plot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from relpos.functional import rope_frequencies
from relpos.validation import check_float, check_int

from ..io import save_figure

__all__ = [
    "FrequencyProfile",
    "frequency_profile",
    "scaling_presets",
    "default_profiles",
    "plot_wavelengths",
]


@dataclass(frozen=True)
class FrequencyProfile:
    """``inv_freq[i]`` (``theta_i``), ``wavelength[i] = 2 pi / theta_i`` (``inf`` for a zero
    frequency) and the attention factor of one scaling; ``seq_len`` is the length the
    frequencies were taken at (length-dependent types)."""

    label: str
    scaling: dict[str, Any] | None
    head_dim: int
    base: float
    seq_len: int | None
    max_position_embeddings: int | None
    inv_freq: list[float]
    wavelength: list[float]
    attention_factor: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def frequency_profile(
    head_dim: int = 128,
    base: float = 10000.0,
    scaling: Mapping[str, Any] | None = None,
    *,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    label: str | None = None,
) -> FrequencyProfile:
    """Frequencies and wavelengths of one scaling (``None``: default RoPE).

    Arguments are those of ``relpos.functional.rope_frequencies`` (validated there: unknown or
    missing keys raise ``ValueError``).
    """
    if scaling is not None and not isinstance(scaling, Mapping):
        raise TypeError(f"scaling must be a dict or None, got {type(scaling).__name__}")
    scaling = dict(scaling) if scaling is not None else None
    inv_freq, factor = rope_frequencies(
        head_dim,
        base,
        scaling,
        seq_len=seq_len,
        max_position_embeddings=max_position_embeddings,
    )
    theta = inv_freq.double().tolist()
    wavelength = [2 * math.pi / t if t > 0 else math.inf for t in theta]
    if label is None:
        label = "default" if scaling is None else str(scaling.get("rope_type", scaling.get("type")))
    return FrequencyProfile(
        label=label,
        scaling=scaling,
        head_dim=head_dim,
        base=float(base),
        seq_len=seq_len,
        max_position_embeddings=max_position_embeddings,
        inv_freq=theta,
        wavelength=wavelength,
        attention_factor=float(factor),
    )


def scaling_presets(
    head_dim: int = 128, factor: float = 4.0, original: int = 2048
) -> dict[str, dict[str, Any]]:
    """One example dict per scaling type, extending ``original`` tokens by ``factor``.

    Llama 3 uses its published band factors (low 1, high 4); LongRoPE a synthetic
    ``long_factor = linspace(1, factor, d/2)``; p-RoPE keeps a quarter of the
    frequencies (``partial_rotary_factor`` 0.25, as Gemma 4). Length-dependent types are
    evaluated at ``factor * original`` by ``default_profiles``.
    """
    head_dim = check_int(head_dim, "head_dim", minimum=2)
    factor = check_float(factor, "factor", minimum=1.0)
    original = check_int(original, "original")
    half = head_dim // 2
    step = (factor - 1.0) / (half - 1) if half > 1 else 0.0
    return {
        "linear": {"rope_type": "linear", "factor": factor},
        "ntk": {"rope_type": "ntk", "factor": factor},
        "dynamic": {"rope_type": "dynamic", "factor": factor},
        "yarn": {
            "rope_type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": original,
        },
        "llama3": {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": original,
        },
        "longrope": {
            "rope_type": "longrope",
            "short_factor": [1.0] * half,
            "long_factor": [1.0 + step * i for i in range(half)],
            "factor": factor,
            "original_max_position_embeddings": original,
        },
        "proportional": {"rope_type": "proportional", "partial_rotary_factor": 0.25},
    }


def _number(value: object) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    return float(value) if ok else None


def default_profiles(
    head_dim: int = 128,
    base: float = 10000.0,
    factor: float = 4.0,
    original: int = 2048,
    scalings: Sequence[Mapping[str, Any]] | None = None,
) -> list[FrequencyProfile]:
    """Default RoPE plus each scaling (``scaling_presets`` when ``scalings`` is None).

    Each scaling is read at its extended length ``factor * original`` (what dynamic NTK and
    LongRoPE depend on), taking ``factor`` and ``original_max_position_embeddings`` from the
    dict when it has them; ``original`` is also passed as ``max_position_embeddings``.
    """
    factor = check_float(factor, "factor", minimum=1.0)
    original = check_int(original, "original")
    if scalings is None:
        scalings = list(scaling_presets(head_dim, factor, original).values())
    profiles = [frequency_profile(head_dim, base, None)]
    for s in scalings:
        if not isinstance(s, Mapping):
            raise TypeError(f"each scaling must be a dict, got {type(s).__name__}")
        own_original = _number(s.get("original_max_position_embeddings"))
        length = int(own_original) if own_original else original
        own_factor = _number(s.get("factor")) or factor
        target = max(int(round(max(own_factor, 1.0) * length)), 1)
        profiles.append(
            frequency_profile(head_dim, base, s, seq_len=target, max_position_embeddings=length)
        )
    return profiles


def plot_wavelengths(
    profiles: Sequence[FrequencyProfile],
    path: str | Path,
    *,
    original: int | None = None,
    target: int | None = None,
) -> None:
    """Wavelength (tokens, log scale) per pair index, one line per profile; horizontal lines
    at the ``original`` and ``target`` context lengths. Written atomically as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not profiles:
        raise ValueError("profiles must not be empty")
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    colors = plt.get_cmap("tab10")
    for n, p in enumerate(profiles):
        ys = [w if math.isfinite(w) else float("nan") for w in p.wavelength]
        style = "-" if p.label == "default" else "--"
        ax.plot(
            range(len(ys)),
            ys,
            style,
            color=colors(n % 10),
            linewidth=1.3,
            label=f"{p.label} (attention x{p.attention_factor:.3g})",
        )
    for value, name in ((original, "original context"), (target, "target context")):
        if value is not None:
            ax.axhline(value, color="0.4", linestyle=":", linewidth=1.0)
            ax.annotate(name, (0, value), textcoords="offset points", xytext=(2, 3), fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("pair index i (theta_i descending)")
    ax.set_ylabel("wavelength 2 pi / theta_i (tokens)")
    ax.set_title(
        f"RoPE wavelengths, head_dim {profiles[0].head_dim}, base {profiles[0].base:g} "
        "(zero frequencies not drawn)",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    save_figure(fig, path)
