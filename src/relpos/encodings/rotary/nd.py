"""N-D and continuous rotary encodings: axial 2-D/3-D RoPE, RoPE-Mixed, normalised 2-D RoPE
(STAR), M-RoPE, hierarchical RoPE and continuous-time RoPE.

All of them are one computation (``SectionedRoPE``): rotary pair ``p`` of head ``h`` turns by

    angle[h, p] = sum_a  pos[a] * F[h, p, a]          pos: the token's m position axes

with a frequency matrix ``F (H|1, P, m)``. Axial encodings put one non-zero per pair (pairs
are split in contiguous *sections*, one per axis); RoPE-Mixed learns a dense ``F``. Since the
angle is linear in the positions, ``<R(p) q, R(p') k>`` depends on ``p - p'`` only: every
encoding here is relative on every axis (and for fractional shifts).

Two ways to give sections their frequencies (``spectrum``):

* ``"per_axis"`` — every axis restarts its own spectrum ``theta_j = base^(-j / n_a)`` over its
  ``n_a`` pairs (RoPE-ViT axial, Wan2.1 / HunyuanVideo 3-D, STAR);
* ``"shared"`` — one spectrum ``theta_i = base^(-2i / d)`` over all pairs, and the sections
  only choose which axis drives each pair (Qwen2-VL M-RoPE, hierarchical RoPE).

Angles are formed in float64; integer positions up to 2^16 are cast directly (float32 angles
as the reference code forms them with autocast off), everything else (large positions,
fractional positions, timestamps) is reduced modulo 2 pi first (``functional.rope_angles``).
Shapes: ``x (B, H, L, D)``, positions ``(B|1, L, m)`` (``(B|1, L)`` when m = 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ...functional import EXACT_ANGLE_LIMIT
from ...registry import register
from ..base import Encoding
from .rope import rotate_pairs


def split_pairs(total: int, parts: int) -> list[int]:
    """``total`` rotary pairs over ``parts`` axes as evenly as possible, the remainder going to
    the first axis (Wan2.1: 64 pairs -> [22, 21, 21])."""
    base = total // parts
    return [total - base * (parts - 1)] + [base] * (parts - 1)


def section_frequencies(
    sections: Sequence[int], base: float | Sequence[float], spectrum: str, head_dim: int
) -> Tensor:
    """The one-hot frequency matrix ``F (P, m)`` of an axial encoding (float64).

    ``sections[a]`` pairs (contiguous, in axis order) are driven by axis ``a``. ``spectrum``:
    ``"per_axis"`` gives section ``a`` the frequencies ``base_a^(-j / n_a)``, ``j < n_a``;
    ``"shared"`` gives pair ``i`` the frequency ``base^(-2 i / head_dim)``.
    """
    m = len(sections)
    bases = [float(base)] * m if isinstance(base, (int, float)) else [float(b) for b in base]
    if len(bases) != m:
        raise ValueError(f"base must be a number or one per axis ({m}), got {list(base)}")  # type: ignore[arg-type]
    total = sum(sections)
    F = torch.zeros(total, m, dtype=torch.float64)
    start = 0
    for a, n in enumerate(sections):
        if spectrum == "per_axis":
            freq = bases[a] ** (-torch.arange(n, dtype=torch.float64) / n)
        else:
            i = torch.arange(start, start + n, dtype=torch.float64)
            freq = bases[0] ** (-2 * i / head_dim)
        F[start : start + n, a] = freq
        start += n
    return F


def nd_angles(pos: Tensor, freq: Tensor) -> Tensor:
    """Angles ``sum_a pos[..., a] * freq[h, p, a]``: ``pos (B, L, m)``, ``freq (G, P, m)`` ->
    ``(B, G, L, P)`` float32, with the precision policy of ``functional.rope_angles``: formed
    in float64, cast directly for integer positions up to 2^16 on every axis, reduced modulo
    2 pi first otherwise (per token)."""
    ang = torch.einsum("blm,gpm->bglp", pos.to(torch.float64), freq.to(torch.float64))
    reduced = torch.remainder(ang, 2 * math.pi)
    if pos.is_floating_point():
        return reduced.to(torch.float32)
    small = (pos.abs() <= EXACT_ANGLE_LIMIT).all(-1)[:, None, :, None]
    return torch.where(small, ang, reduced).to(torch.float32)


class SectionedRoPE(Encoding):
    """Multi-axis rotary encoding with a frequency matrix ``F (H|1, P, m)`` (module docstring).

    Subclasses build ``F``. Args common to all: ``layout`` ("half" / "interleaved") and the
    number of rotated pairs ``P <= head_dim / 2`` (the remaining channels pass through).
    """

    family = "rotary"
    has_rotary = True
    continuous = True

    def __init__(self, num_heads: int, head_dim: int, *, layout: str, dims: int) -> None:
        super().__init__(num_heads, head_dim)
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for a rotary encoding, got {head_dim}")
        if layout not in ("half", "interleaved"):
            raise ValueError(f"layout must be 'half' or 'interleaved', got {layout!r}")
        if isinstance(dims, bool) or not isinstance(dims, int) or dims < 1:
            raise ValueError(f"dims must be a positive int, got {dims!r}")
        self.layout = layout
        self.dims = dims

    def frequency_matrix(self, device: torch.device) -> Tensor:
        """``F (H|1, P, m)`` on ``device``; subclasses return fixed float64 frequencies or a
        parameter."""
        raise NotImplementedError

    def _check_head_dim(self, x: Tensor, role: str) -> None:
        if x.shape[-1] != self.head_dim:
            raise ValueError(
                f"{role} has head_dim {x.shape[-1]} but the encoding was created with "
                f"head_dim={self.head_dim}"
            )

    def rotate(self, x: Tensor, pos: Tensor, role: str) -> Tensor:
        if role not in ("q", "k"):
            return x
        self._check_head_dim(x, role)
        if pos.dim() == 2:  # 1-D encodings receive (B, L)
            pos = pos[..., None]
        freq = self.frequency_matrix(x.device)
        if freq.shape[0] > 1 and x.shape[1] != freq.shape[0]:
            # per-head frequencies and grouped keys: each query head sees its own rotation
            x = x.repeat_interleave(freq.shape[0] // x.shape[1], dim=1)
        ang = nd_angles(pos, freq)
        return rotate_pairs(x, ang.cos(), ang.sin(), self.layout)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, dims={self.dims}, layout={self.layout!r}"


def _check_sections(sections: Sequence[int], head_dim: int, dims: int, arg: str) -> list[int]:
    sections = [int(s) for s in sections]
    if len(sections) != dims or any(s < 0 for s in sections):
        raise ValueError(f"{arg} must list {dims} non-negative pair counts, got {sections}")
    if sum(sections) > head_dim // 2:
        raise ValueError(
            f"{arg} {sections} rotates {sum(sections)} pairs but head_dim={head_dim} has only "
            f"{head_dim // 2}"
        )
    return sections


class AxialRoPE(SectionedRoPE):
    """Fixed one-hot frequency matrix from ``sections`` (pairs per axis) and a spectrum."""

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        dims: int,
        sections: Sequence[int] | None,
        base: float | Sequence[float],
        spectrum: str,
        layout: str,
    ) -> None:
        super().__init__(num_heads, head_dim, layout=layout, dims=dims)
        if spectrum not in ("per_axis", "shared"):
            raise ValueError(f"spectrum must be 'per_axis' or 'shared', got {spectrum!r}")
        if sections is None:
            sections = split_pairs(head_dim // 2, dims)
        self.sections = _check_sections(sections, head_dim, dims, "sections")
        self.base = base
        self.spectrum = spectrum
        # float64, and not a buffer: ``module.to(torch.bfloat16)`` must never round the
        # frequencies (angles are formed in float32/float64 whatever the activations are)
        self.freq = section_frequencies(self.sections, base, spectrum, head_dim)[None]

    def frequency_matrix(self, device: torch.device) -> Tensor:
        return self.freq.to(device)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, sections={self.sections}, base={self.base}"


@register("rope-axial")
class RoPEAxial(AxialRoPE):
    """Axial N-D RoPE (RoPE-ViT, Heo et al. 2024; 3-D video RoPE of Wan2.1 / HunyuanVideo).

    Each axis drives its own contiguous section of pairs with its own spectrum
    ``theta_j = base_a^(-j / n_a)``. Defaults: 2 axes, pairs split evenly (remainder to the
    first axis, as Wan2.1 gives time the extra pairs), base 10000, interleaved layout.
    RoPE-ViT: ``base=100`` (spec R.10); Wan2.1: ``dims=3``; HunyuanVideo: ``dims=3,
    sections=[8, 28, 28], base=256``. Positions ``(B, L, dims)``, e.g. from
    ``relpos.positions_nd.grid_positions``.
    """

    paper = "Heo et al. 2024 (RoPE-ViT, axial); Wan2.1 / HunyuanVideo 3-D"
    dims = 2

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        dims: int = 2,
        sections: Sequence[int] | None = None,
        base: float | Sequence[float] = 10000.0,
        layout: str = "interleaved",
    ) -> None:
        super().__init__(
            num_heads,
            head_dim,
            dims=dims,
            sections=sections,
            base=base,
            spectrum="per_axis",
            layout=layout,
        )


@register("m-rope")
class MRoPE(AxialRoPE):
    """Multimodal RoPE of Qwen2-VL (and Qwen3-VL's interleaved variant).

    One spectrum ``theta_i = base^(-2i/d)`` over all pairs; ``mrope_section`` (default
    ``[16, 24, 24]`` scaled to head_dim) assigns contiguous pair bands to the (temporal,
    height, width) axes. ``interleaved_sections=True`` is Qwen3-VL: every pair starts on t,
    pairs ``i = 1 mod 3`` below ``3 * sections[1]`` take h, ``i = 2 mod 3`` below
    ``3 * sections[2]`` take w. Text tokens carry the same id on all three axes, which makes
    it plain RoPE there. Positions ``(B, L, 3)`` from
    ``relpos.positions_nd.multimodal_position_ids``. Half-split layout (HF).
    """

    paper = "Wang et al. 2024 (Qwen2-VL, M-RoPE)"
    dims = 3

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        mrope_section: Sequence[int] | None = None,
        base: float = 10000.0,
        layout: str = "half",
        interleaved_sections: bool = False,
    ) -> None:
        if mrope_section is None and type(head_dim) is int and head_dim > 0:
            pairs = head_dim // 2
            t = pairs * 16 // 64
            mrope_section = [t, (pairs - t) // 2, pairs - t - (pairs - t) // 2]
        super().__init__(
            num_heads,
            head_dim,
            dims=3,
            sections=mrope_section,
            base=base,
            spectrum="shared",
            layout=layout,
        )
        self.interleaved_sections = bool(interleaved_sections)
        if self.interleaved_sections:
            t, h, w = self.sections
            total = t + h + w
            i = torch.arange(total)
            axis = torch.zeros(total, dtype=torch.long)
            axis[(i % 3 == 1) & (i < 3 * h)] = 1
            axis[(i % 3 == 2) & (i < 3 * w)] = 2
            theta = base ** (-2 * i.double() / head_dim)
            F = torch.zeros(total, 3, dtype=torch.float64)
            F[i, axis] = theta
            self.freq = F[None]


@register("rope-hierarchical")
class HierarchicalRoPE(AxialRoPE):
    """Hierarchical RoPE (hRoPE / HiRoPE): paragraph, sentence and token channels.

    Authority C (no code): implemented as the spec suggests, as sectioned RoPE with one shared
    spectrum. Assumed: positions ``(B, L, 3)`` are (token, sentence, paragraph) indices
    (``relpos.positions_nd.hierarchical_positions``), and the first section (highest
    frequencies) goes to the finest level; ``sections`` sets the pairs per level (default an
    even split, remainder to the token level) and ``levels`` the number of levels.
    """

    paper = "hRoPE / HiRoPE (hierarchical positions; Authority C)"
    dims = 3

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        sections: Sequence[int] | None = None,
        levels: int = 3,
        base: float = 10000.0,
        layout: str = "half",
    ) -> None:
        super().__init__(
            num_heads,
            head_dim,
            dims=levels,
            sections=sections,
            base=base,
            spectrum="shared",
            layout=layout,
        )


@register("rope-2d-normalized")
class NormalizedRoPE2D(AxialRoPE):
    """Normalised 2-D RoPE for scale-wise autoregressive generation (STAR; Infinity's
    ``rope2d_normalized_by_hw=2``, "star style"; Authority B).

    Every scale's grid is mapped into the frame of the largest grid ``reference_grid =
    (uph, upw)``: positions are given *normalised* (row / ph, col / pw), e.g. from
    ``relpos.positions_nd.scale_positions``, and the encoding uses
    ``round(r * uph / ph), round(c * upw / pw)`` (``rounding=True``, the Infinity code) or the
    unrounded product (``rounding=False``: exactly relative, continuous). First half of the
    pairs rows, second half columns, ``theta_j = base^(-j / (d/4))``, interleaved pairs.
    """

    paper = "STAR (scale-wise AR, normalised 2-D RoPE); Infinity mode 2"
    dims = 2
    relative = False  # with rounding; the instance says True when rounding=False

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        reference_grid: Sequence[int] = (16, 16),
        rounding: bool = True,
        base: float = 10000.0,
        layout: str = "interleaved",
    ) -> None:
        super().__init__(
            num_heads,
            head_dim,
            dims=2,
            sections=None,
            base=base,
            spectrum="per_axis",
            layout=layout,
        )
        grid = [int(g) for g in reference_grid]
        if len(grid) != 2 or min(grid) < 1:
            raise ValueError(f"reference_grid must be (rows, cols) >= 1, got {reference_grid}")
        self.reference_grid = grid
        self.rounding = bool(rounding)
        self.relative = not self.rounding

    def rotate(self, x: Tensor, pos: Tensor, role: str) -> Tensor:
        if role in ("q", "k"):
            scaled = pos.to(torch.float64) * torch.tensor(
                self.reference_grid, dtype=torch.float64, device=pos.device
            )
            pos = torch.round(scaled).long() if self.rounding else scaled
        return super().rotate(x, pos, role)


@register("rope-mixed")
class RoPEMixed(SectionedRoPE):
    """RoPE-Mixed (Heo et al. 2024): learnable 2-D frequencies per head.

    ``angle[h, p] = t_x f_x[h, p] + t_y f_y[h, p]`` with ``f (H, d/2, 2)`` a parameter
    (exclude it from weight decay). Init (naver-ai/rope-vit ``init_random_2d_freqs``): per
    head ``alpha ~ U(0, 2 pi)``, magnitudes ``mag_j = base^(-4j/d)`` (``j < d/4``, base 10),
    ``f_x = [mag cos(alpha), mag cos(pi/2 + alpha)]``, ``f_y = [mag sin(alpha),
    mag sin(pi/2 + alpha)]``. Interleaved pairs. Positions ``(B, L, 2)`` = (x, y).
    """

    paper = "Heo et al. 2024 (RoPE-ViT, RoPE-Mixed)"
    dims = 2

    def __init__(
        self, num_heads: int, head_dim: int, *, base: float = 10.0, layout: str = "interleaved"
    ) -> None:
        super().__init__(num_heads, head_dim, layout=layout, dims=2)
        if head_dim % 4:
            raise ValueError(f"head_dim must be a multiple of 4 for RoPE-Mixed, got {head_dim}")
        quarter = head_dim // 4
        mag = float(base) ** (-4 * torch.arange(quarter, dtype=torch.float64) / head_dim)
        alpha = torch.rand(num_heads, 1, dtype=torch.float64) * 2 * math.pi
        fx = torch.cat((mag * torch.cos(alpha), mag * torch.cos(math.pi / 2 + alpha)), dim=-1)
        fy = torch.cat((mag * torch.sin(alpha), mag * torch.sin(math.pi / 2 + alpha)), dim=-1)
        self.freq = nn.Parameter(torch.stack((fx, fy), dim=-1).float())  # (H, d/2, 2)
        # grouped keys are expanded to the query heads when rotated: cache them raw
        self.cache_rotated_keys = False

    def frequency_matrix(self, device: torch.device) -> Tensor:
        return self.freq


@register("time-rope")
class TimeRoPE(AxialRoPE):
    """Continuous-time RoPE (DuET / TPRoPE; Authority C): real-valued timestamps.

    ``angle_i = tau * time_scale * theta_i``, ``theta_i = base^(-2i/d)``, with float positions
    ``tau`` (seconds, MIDI ticks) formed in float64 (never bf16). ``sections`` with more than
    one entry adds axes in the M-RoPE way (TPRoPE: time and pitch share one spectrum, each
    driving its band of pairs); ``time_scale`` may then be one number per axis.
    """

    paper = "DuET / TPRoPE (continuous-time positions; Authority C)"
    dims = 1

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        time_scale: float | Sequence[float] = 1.0,
        sections: Sequence[int] | None = None,
        base: float = 10000.0,
        layout: str = "half",
    ) -> None:
        dims = 1 if sections is None else len(sections)
        super().__init__(
            num_heads,
            head_dim,
            dims=dims,
            sections=sections,
            base=base,
            spectrum="shared",
            layout=layout,
        )
        scales = [time_scale] * dims if isinstance(time_scale, (int, float)) else time_scale
        scales = [float(s) for s in scales]
        if len(scales) != dims or not all(s > 0 for s in scales):
            raise ValueError(
                f"time_scale must be a positive number or one per axis ({dims}), got {time_scale}"
            )
        self.time_scale = scales
        self.freq = self.freq * torch.tensor(scales, dtype=torch.float64)[None, None, :]
