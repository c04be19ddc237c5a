"""Drawing the atlas (``relpos_lab.docsite.atlas``) as PNG bytes with matplotlib (Agg).

PNGs carry no creation time or software stamp, so a figure's bytes depend only on the numbers
and the matplotlib version.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np

from .atlas import GridMap, Patterns, Profile

__all__ = ["profile_png", "grid_png", "patterns_png", "comparison_png", "pattern_comparison_png"]

#: heads a grid map shows (the first ones)
GRID_HEADS = 4
DPI = 90


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    plt = _pyplot()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    finally:
        plt.close(fig)
    return buf.getvalue()


def _draw_profile(ax: Any, profile: Profile, legend: bool = True) -> None:
    plt = _pyplot()
    heads = profile.values.shape[0]
    colors = plt.get_cmap("viridis")
    x = profile.distances.numpy()
    for h in range(heads):
        color = colors(h / max(heads - 1, 1)) if heads > 1 else "tab:blue"
        ax.plot(x, profile.values[h].numpy(), color=color, lw=1.2, label=f"head {h}")
    ax.axvline(0, color="0.6", lw=0.6, ls=":")
    ax.set_xlabel("d = q_pos - k_pos")
    ax.set_ylabel(profile.ylabel)
    ax.grid(alpha=0.3)
    if legend and heads > 1:
        ax.legend(fontsize=6, ncol=2, loc="best", frameon=False)


def profile_png(name: str, profile: Profile) -> bytes:
    """One panel: a curve per head against relative distance."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 3.4))
    _draw_profile(ax, profile)
    ax.set_title(f"{name}: {profile.title}", fontsize=9)
    fig.tight_layout()
    return _png(fig)


def grid_png(name: str, grid: GridMap) -> bytes:
    """Columns: the first ``GRID_HEADS`` heads; rows: slices along axis 0 (m >= 3). The
    query's cell is marked with a cross."""
    plt = _pyplot()
    values = grid.values.numpy()
    heads = min(GRID_HEADS, values.shape[0])
    slices = values.shape[1]
    shown = values[:heads]
    finite = shown[np.isfinite(shown)]
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    fig, axes = plt.subplots(
        slices, heads, figsize=(2.1 * heads + 1.0, 2.1 * slices + 0.6), squeeze=False
    )
    image = None
    for s in range(slices):
        for h in range(heads):
            ax = axes[s][h]
            image = ax.imshow(values[h, s], cmap="magma", vmin=vmin, vmax=vmax)
            if slices == 1 or s == grid.centre[0]:
                ax.plot(grid.centre[-1], grid.centre[-2], "c+", ms=8, mew=1.5)
            ax.set_xticks([])
            ax.set_yticks([])
            if s == 0:
                ax.set_title(f"head {h}", fontsize=8)
            if h == 0 and slices > 1:
                ax.set_ylabel(f"axis 0 = {grid.slice_values[s]}", fontsize=8)
    fig.suptitle(f"{name}: logit added (similar key) from the centre query", fontsize=9)
    fig.colorbar(image, ax=[axes[s][h] for s in range(slices) for h in range(heads)], shrink=0.8)
    return _png(fig)


def _row_scaled(weights: Any) -> Any:
    """Each row divided by its largest weight (rows of many keys stay visible beside rows of
    one); masked entries stay 0."""
    top = weights.max(dim=-1, keepdim=True).values.clamp_min(1e-30)
    return (weights / top).numpy()


def patterns_png(name: str, patterns: Patterns) -> bytes:
    """Rows: shared ``q = k = u`` and independent random ``q, k``; columns: lengths."""
    plt = _pyplot()
    n = len(patterns.lengths)
    fig, axes = plt.subplots(2, n, figsize=(2.3 * n + 0.4, 4.9), squeeze=False)
    rows = (("q = k = u", patterns.shared), ("random q, k", patterns.random))
    for r, (label, weights) in enumerate(rows):
        for c in range(n):
            ax = axes[r][c]
            ax.imshow(
                _row_scaled(weights[c]), cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest"
            )
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                shape = " x ".join(map(str, patterns.shapes[c]))
                ax.set_title(
                    f"L = {patterns.lengths[c]}"
                    + (f" ({shape})" if len(patterns.shapes[c]) > 1 else ""),
                    fontsize=8,
                )
            if c == 0:
                ax.set_ylabel(label, fontsize=8)
    mask = "causal" if patterns.causal else "no mask"
    fig.suptitle(
        f"{name}: attention weights of head 0 ({mask}; rows: queries, scaled to their maximum)",
        fontsize=9,
    )
    fig.tight_layout()
    return _png(fig)


def comparison_png(profiles: Sequence[tuple[str, Profile]], columns: int = 3) -> bytes:
    """Distance profiles of several encodings side by side (the README's atlas figure)."""
    plt = _pyplot()
    rows = -(-len(profiles) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 2.7 * rows), squeeze=False)
    for i, (name, profile) in enumerate(profiles):
        ax = axes[i // columns][i % columns]
        _draw_profile(ax, profile, legend=False)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.xaxis.label.set_size(7)
        ax.yaxis.label.set_size(7)
    for j in range(len(profiles), rows * columns):
        axes[j // columns][j % columns].axis("off")
    fig.tight_layout()
    return _png(fig)


def pattern_comparison_png(weights: Sequence[tuple[str, Any]], columns: int = 3) -> bytes:
    """Attention weights ``(L, L)`` of several encodings side by side, each row scaled to its
    maximum (the README's second atlas figure)."""
    plt = _pyplot()
    rows = -(-len(weights) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(2.9 * columns, 3.0 * rows), squeeze=False)
    for i, (name, w) in enumerate(weights):
        ax = axes[i // columns][i % columns]
        ax.imshow(_row_scaled(w), cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_title(name, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    for j in range(len(weights), rows * columns):
        axes[j // columns][j % columns].axis("off")
    fig.tight_layout()
    return _png(fig)
