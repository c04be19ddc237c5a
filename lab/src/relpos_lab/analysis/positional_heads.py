"""Positional heads: dimension-level analysis of rotary attention (Hong et al. 2024, "On the
Token Distance Modeling Ability of Higher RoPE Attention Dimension", arXiv 2410.08703).

No code was found; the metric is reconstructed from the abstract. The claim: correlating each RoPE
dimension's share of the score with the token distance identifies "positional heads", which put
long-range attention on the high (low-frequency) dimensions.

For rotated queries and keys ``q̃, k̃`` of one head, per rotary pair c (channels ``(2c, 2c+1)``
interleaved, ``(c, c + d/2)`` half-split):

    g_c(m, n) = q̃_{m,a} k̃_{n,a} + q̃_{m,b} k̃_{n,b}          (Σ_c g_c = q̃_m · k̃_n)
    ĉ(m, n)   = Σ_c c · softmax_c(g(m, n))                   (the dimension centroid)
    ρ_h       = Pearson correlation of ĉ with log(1 + m - n), weighted by the attention a_mn

over causal pairs; the positional heads are the top-k by ρ. Also reported: the share of |g|
on the upper half of the pairs (the low frequencies) for distances above a threshold.

Reference (q = k = 1, d = 16, base 10⁴: ``g_c(r) = 2 cos(r θ_c)``): the centroid at r = 0, 1, 4,
16, 64, 256, 1024 is ``3.5, 3.823, 4.3954, 4.7902, 4.4171, 4.3368, 3.6314``.

Before and after a context extension (ρ before and after PI or YaRN):
``model_head_scores`` scores a model on one prompt, ``scaled_head_scores`` repeats it with
the model's RoPE replaced by a frequency scaling (``relpos.rope_scaling`` records: ``linear``
= PI, ``yarn``, ...) on the same tokens, and ``ranking_change`` compares each with the
unscaled model: the top-k heads kept, entered and left, the mean ``|Δρ|`` and the
correlation of the two ρ maps.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from relpos.validation import check_choice, check_int

__all__ = [
    "HeadScores",
    "pair_contributions",
    "dimension_centroid",
    "head_scores",
    "encoding_head_scores",
    "pair_profile",
    "model_head_scores",
    "scaled_head_scores",
    "ranking_change",
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
    #: for models, the top heads' ``E[g_c]`` by log-distance bucket (``pair_profile``):
    #: ``[{"layer", "head", "buckets": [[lo, hi], ...], "mean_g": [bucket][pair]}]``
    profiles: list[dict[str, Any]] | None = None

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


def pair_profile(q: Tensor, k: Tensor, *, layout: str = "half") -> tuple[list, Tensor]:
    """``E[g_c]`` over the causal pairs of one head in log-distance buckets: ``q, k (L, d)``
    rotated. Bucket n holds distances ``2^n - 1 <= m - n < 2^(n+1) - 1`` (0, 1-2, 3-6, ...).
    Returns (the buckets ``[lo, hi]``, ``(buckets, d/2)`` float64)."""
    L = q.shape[0]
    g = pair_contributions(q.double(), k.double(), layout)  # (L, L, d/2)
    r = torch.arange(L)[:, None] - torch.arange(L)[None, :]
    causal = r >= 0
    bucket = torch.floor(torch.log2(1.0 + r.clamp(min=0).double())).long()
    rows, edges = [], []
    for n in range(int(bucket[causal].max()) + 1):
        sel = causal & (bucket == n)
        rows.append(g[sel].mean(0))
        edges.append([2**n - 1, min(2 ** (n + 1) - 2, L - 1)])
    return edges, torch.stack(rows)


def model_head_scores(
    model: Any, tokens: Tensor, label: str, top_k: int, *, profiled: int = 3
) -> HeadScores:
    """ρ per (layer, head) of a relpos model with rotary attention on ``tokens (1, L)``, and
    the ``E[g_c]`` profile (``pair_profile``) of its ``profiled`` top heads."""
    from .model_capture import capture_attention

    rho, share, layers = [], [], []
    for cap in capture_attention(model, tokens):
        if cap.encoding is None or not cap.encoding.has_rotary:
            raise ValueError(f"{label}: its attention is not rotary")
        layout = getattr(cap.encoding, "layout", "half")
        r, s = head_scores(cap.q[0], cap.k[0], cap.weights[0], layout=layout)
        rho.append(r)
        share.append(s)
        layers.append((cap.q[0], cap.k[0], layout))
    result = HeadScores.of(label, rho, share, top_k)
    result.profiles = []
    for layer, head, _ in result.top[:profiled]:
        q, k, layout = layers[layer]
        edges, mean = pair_profile(q[head], k[head], layout=layout)
        result.profiles.append(
            {"layer": layer, "head": head, "buckets": edges, "mean_g": mean.tolist()}
        )
    return result


def scaled_head_scores(
    model: Any, tokens: Tensor, label: str, scaling: dict[str, Any], top_k: int
) -> HeadScores:
    """``model_head_scores`` with the model's RoPE under ``scaling`` (an HF ``rope_scaling``
    record, checked by ``relpos.rope_scaling``), its own encoding restored afterwards. The
    model must be able to swap its encoding (``LlamaLM.set_encoding``: the model's base,
    layout and trained length are kept)."""
    if not hasattr(model, "set_encoding"):
        raise ValueError(
            f"{label}: rope scalings need a Llama-family model (smollm2, random-tiny or a "
            ".gguf file), whose RoPE can be swapped"
        )
    own = model.encoding
    try:
        model.set_encoding("rope", scaling=scaling)
        return model_head_scores(model, tokens, label, top_k)
    finally:
        model.set_encoding(own)


def ranking_change(reference: HeadScores, other: HeadScores) -> dict[str, Any]:
    """How ``other``'s positional heads differ from ``reference``'s (same model and prompt):
    top-k heads kept / entered / left (``(layer, head)``), mean ``|Δρ|`` over heads, the
    Pearson correlation of the two ρ maps, and the head whose ρ moved most."""
    a = torch.tensor(reference.rho, dtype=torch.float64)
    b = torch.tensor(other.rho, dtype=torch.float64)
    if a.shape != b.shape:
        raise ValueError(f"ρ maps differ in shape: {tuple(a.shape)} and {tuple(b.shape)}")
    ok = ~(torch.isnan(a) | torch.isnan(b))
    delta = torch.where(ok, b - a, torch.zeros_like(a))
    top_a = [(layer, head) for layer, head, _ in reference.top]
    top_b = [(layer, head) for layer, head, _ in other.top]
    x, y = a[ok], b[ok]
    den = float(((x - x.mean()) ** 2).sum().sqrt() * ((y - y.mean()) ** 2).sum().sqrt())
    corr = float(((x - x.mean()) * (y - y.mean())).sum()) / den if den > 0 else math.nan
    flat = int(delta.abs().argmax())
    layer, head = divmod(flat, a.shape[1])
    return {
        "label": other.label,
        "reference": reference.label,
        "kept": [list(t) for t in top_b if t in top_a],
        "entered": [list(t) for t in top_b if t not in top_a],
        "left": [list(t) for t in top_a if t not in top_b],
        "mean_abs_delta": float(delta.abs()[ok].mean()) if bool(ok.any()) else math.nan,
        "correlation": corr,
        "largest_change": [layer, head, float(delta[layer, head])],
    }


def plot_head_scores(results: list[HeadScores], path: Any, *, reference: int | None = None) -> None:
    """ρ heat map (layer x head) per result, side by side; with ``reference`` (an index into
    ``results``) a second row holds every other result's ``Δρ`` against it, and when every
    result has profiles (models) a last row the top head's ``E[g_c]`` against log distance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..io import save_figure

    deltas_row = reference is not None and len(results) >= 2
    profile_row = all(r.profiles for r in results)
    rows = 1 + deltas_row + profile_row
    fig, axes = plt.subplots(
        rows, len(results), figsize=(5 * len(results), 4 * rows), squeeze=False
    )
    if profile_row:  # E[g_c] of each result's top head against log distance
        for ax, r in zip(axes[-1], results, strict=True):
            p = r.profiles[0]
            mean = torch.tensor(p["mean_g"]).T  # (pairs, buckets)
            top = float(mean.abs().max()) or 1.0
            im = ax.imshow(mean, aspect="auto", origin="lower", cmap="RdBu_r", vmin=-top, vmax=top)
            ax.set_xticks(range(len(p["buckets"])), [f"{lo}" for lo, _ in p["buckets"]])
            ax.set_xlabel("distance m - n (bucket start, log2 buckets)")
            ax.set_ylabel("rotary pair c (high = low frequency)")
            ax.set_title(f"{r.label}: E[g_c], layer {p['layer']} head {p['head']}", fontsize=9)
            fig.colorbar(im, ax=ax)
    for ax, r in zip(axes[0], results, strict=True):
        im = ax.imshow(r.rho, aspect="auto", cmap="coolwarm", vmin=-1, vmax=1)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"{r.label}: ρ(centroid, log distance)", fontsize=9)
        fig.colorbar(im, ax=ax)
    if deltas_row:
        base = torch.tensor(results[reference].rho, dtype=torch.float64)
        deltas = {
            n: torch.tensor(r.rho, dtype=torch.float64) - base
            for n, r in enumerate(results)
            if n != reference
        }
        top = max(float(d.nan_to_num().abs().max()) for d in deltas.values()) or 1.0
        for n, ax in enumerate(axes[1]):
            if n not in deltas:
                ax.axis("off")
                continue
            im = ax.imshow(deltas[n], aspect="auto", cmap="PiYG", vmin=-top, vmax=top)
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            ax.set_title(f"Δρ: {results[n].label} - {results[reference].label}", fontsize=9)
            fig.colorbar(im, ax=ax)
    fig.tight_layout()
    save_figure(fig, path)
