"""N-D and continuous rotary encodings: axial 2-D/3-D RoPE, RoPE-Mixed, normalised 2-D RoPE
(STAR), M-RoPE, hierarchical RoPE and continuous-time RoPE.

All of them are one computation (``SectionedRoPE``): rotary pair ``p`` of head ``h`` turns by

    angle[h, p] = sum_a  pos[a] * F[h, p, a]          pos: the token's m position axes

with a frequency matrix ``F (H|1, P, m)``. Axial encodings put one non-zero per pair (pairs
are split in contiguous *sections*, one per axis); RoPE-Mixed learns a dense ``F``. Since the
angle is linear in the positions, ``<R(p) q, R(p') k>`` depends on ``p - p'`` only: every
encoding here is relative on every axis (and for fractional shifts), except
``rope-2d-normalized`` with rounding and ``m-rope`` with ``section_split="channels"``
(HunYuanVL: the two channels of a pair may turn by different axes, so ``R(p)`` is no
rotation; ``MRoPE``).

Two ways to give sections their frequencies (``spectrum``):

* ``"per_axis"`` — every axis restarts its own spectrum ``theta_j = base^(-j / n_a)`` over its
  ``n_a`` pairs (RoPE-ViT axial, Wan2.1 / HunyuanVideo 3-D, STAR);
* ``"shared"`` — one spectrum ``theta_i = base^(-2i / d)`` over all pairs, and the sections
  only choose which axis drives each pair (Qwen2-VL M-RoPE, hierarchical RoPE).

Common RoPE options compose (the specs of ``rope.RoPE``'s signature): ``base``, ``layout``,
``partial_rotary_factor`` (only the first ``int(head_dim * p)`` channels rotate; the sections
share those pairs), ``scaling`` (an HF ``rope_scaling`` dict: YaRN, linear, Llama-3, dynamic
NTK, ...) and ``max_position_embeddings``. A scaled spectrum is RoPE's, rescaled as
``functional.rope_frequencies`` rescales it: over the rotated channels of the head for
``"shared"`` (what Qwen2-VL-style models with YaRN compute), over each axis's ``2 n_a``
channels for ``"per_axis"`` (each axis is its own RoPE); the attention factor multiplies cos
and sin (HF). Length-dependent scalings (dynamic NTK, LongRoPE) read the largest position of
the call over every axis, for queries and keys together (``RoPE.call_length``; HF Qwen2-VL:
``max(position_ids) + 1``), and cache raw keys. Without a scaling the spectrum is formed in
float64; with one it takes ``rope_frequencies``' values (float32, equal to transformers') as
float64.

Angles are formed in float64; integer positions up to 2^16 are cast directly (float32 angles
as the reference code forms them with autocast off), everything else (large positions,
fractional positions, timestamps) is reduced modulo 2 pi first (``functional.rope_angles``).
Shapes: ``x (B, H, L, D)``, positions ``(B|1, L, m)`` (``(B|1, L)`` when m = 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Annotated, Any, ClassVar

import torch
from torch import Tensor, nn

from ...functional import EXACT_ANGLE_LIMIT, rope_frequencies
from ...rope_scaling import is_length_dependent
from ...validation import check_float, check_float_sequence
from ..base import Encoding
from ..options import Bool, Choice, Custom, Float, Int, IntSequence, Refused
from ..registry import register
from .rope import (
    ROPE_MAX_POSITION_EMBEDDINGS,
    ROPE_PARTIAL_ROTARY_FACTOR,
    ROPE_SCALING,
    RoPE,
    rotate_pairs,
)


def split_pairs(total: int, parts: int) -> list[int]:
    """``total`` rotary pairs over ``parts`` axes as evenly as possible, the remainder going to
    the first axis (Wan2.1: 64 pairs -> [22, 21, 21])."""
    base = total // parts
    return [total - base * (parts - 1)] + [base] * (parts - 1)


def rope_spectrum(
    dim: int,
    base: float,
    scaling: dict | None = None,
    *,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    partial_rotary_factor: float = 1.0,
) -> tuple[Tensor, float]:
    """RoPE's inverse frequencies over ``dim`` channels as float64, and the attention factor.

    Without ``scaling``: ``base^(-2 i / r)``, ``i < ceil(r / 2)``, ``r = int(dim * p)``, formed
    in float64. With an HF ``scaling`` dict: ``functional.rope_frequencies``' values (float32,
    as transformers computes them; length-dependent types read ``seq_len``).
    """
    if dim == 0:
        return torch.zeros(0, dtype=torch.float64), 1.0
    if scaling is None:
        rotated = int(dim * partial_rotary_factor)
        i = torch.arange(0, rotated, 2, dtype=torch.float64)
        return float(base) ** (-i / rotated), 1.0
    inv_freq, factor = rope_frequencies(
        dim,
        base,
        scaling,
        seq_len=seq_len,
        max_position_embeddings=max_position_embeddings,
        partial_rotary_factor=partial_rotary_factor,
    )
    return inv_freq.double(), float(factor)


def one_hot_frequencies(freq: Tensor, axes: Tensor, dims: int) -> Tensor:
    """``F (P, dims)`` float64 with ``F[p, axes[p]] = freq[p]`` and zeros elsewhere."""
    F = torch.zeros(len(axes), dims, dtype=torch.float64)
    F[torch.arange(len(axes)), axes] = freq.to(torch.float64)
    return F


def _per_axis(value: float | Sequence[float], dims: int, name: str) -> list[float]:
    """A number, or one number per axis, as a list of ``dims`` floats."""
    if isinstance(value, (int, float)):
        return [float(value)] * dims
    values = [float(v) for v in value]
    if len(values) != dims:
        raise ValueError(f"{name} must be a number or one per axis ({dims}), got {list(value)}")
    return values


def section_frequencies(
    sections: Sequence[int], base: float | Sequence[float], spectrum: str, head_dim: int
) -> Tensor:
    """The one-hot frequency matrix ``F (P, m)`` of an unscaled axial encoding (float64).

    ``sections[a]`` pairs (contiguous, in axis order) are driven by axis ``a``. ``spectrum``:
    ``"per_axis"`` gives section ``a`` the frequencies ``base_a^(-j / n_a)``, ``j < n_a``;
    ``"shared"`` gives pair ``i`` the frequency ``base^(-2 i / head_dim)``.
    """
    m = len(sections)
    bases = _per_axis(base, m, "base")
    axes = torch.repeat_interleave(torch.arange(m), torch.tensor(list(sections)))
    if spectrum == "per_axis":
        parts = [rope_spectrum(2 * n, b)[0] for n, b in zip(sections, bases, strict=True)]
        freq = torch.cat(parts)
    else:
        freq = rope_spectrum(head_dim, bases[0])[0][: len(axes)]
    return one_hot_frequencies(freq, axes, m)


def check_number_or_sequence(*, above: float) -> Callable[[object, str], object]:
    """The check of an option that is one number ``> above`` or a list/tuple of them."""

    def check(value: object, name: str) -> float | tuple[float, ...]:
        if isinstance(value, (list, tuple)):
            return check_float_sequence(value, name, above=above)
        return check_float(value, name, above=above)

    return check


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

    Stores the common RoPE options (``RoPE``'s) and rotates; subclasses give ``F``
    (``frequency_matrix``). ``rotary_pairs = ceil(int(head_dim * p) / 2)`` pairs may rotate;
    the remaining channels pass through.
    """

    has_rotary = True
    continuous = True
    default_base: float = 10000.0  # ``base`` when none is given
    default_layout: str = "half"  # ``layout`` when none is given (the method's code)

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        base: Annotated[
            float | Sequence[float] | None,
            Float(above=1.0, optional=True, doc="rope_theta (default: the class's)"),
        ] = None,
        layout: Annotated[
            str | None, Choice(("half", "interleaved"), optional=True, doc="channel pairing")
        ] = None,
        partial_rotary_factor: Annotated[float, ROPE_PARTIAL_ROTARY_FACTOR] = 1.0,
        scaling: Annotated[dict | None, ROPE_SCALING] = None,
        max_position_embeddings: Annotated[int | None, ROPE_MAX_POSITION_EMBEDDINGS] = None,
    ) -> None:
        super().__init__(num_heads, head_dim)
        base = self.default_base if base is None else base
        layout = self.default_layout if layout is None else layout
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for a rotary encoding, got {head_dim}")
        rotated = int(head_dim * partial_rotary_factor)
        if rotated < 2:
            raise ValueError(
                f"partial_rotary_factor={partial_rotary_factor:g} leaves {rotated} rotated "
                f"channels of head_dim={head_dim}; at least 2 must rotate"
            )
        self.base = base
        self.layout = layout
        self.partial_rotary_factor = partial_rotary_factor
        self.scaling = dict(scaling) if scaling is not None else None
        self.max_position_embeddings = max_position_embeddings
        self.rotary_pairs = (rotated + 1) // 2
        self.length_dependent = is_length_dependent(self.scaling)
        if self.length_dependent:
            # frequencies follow the length of each call: cache raw keys, re-rotate
            self.cache_rotated_keys = False

    def frequency_matrix(
        self, device: torch.device, seq_len: int | None = None
    ) -> tuple[Tensor, float]:
        """``(F (H|1, P, m), attention_factor)`` on ``device``; ``seq_len`` (largest position +
        1 of the call) is read by length-dependent scalings only."""
        raise NotImplementedError

    def _check_head_dim(self, x: Tensor, role: str) -> None:
        if x.shape[-1] != self.head_dim:
            raise ValueError(
                f"{role} has head_dim {x.shape[-1]} but the encoding was created with "
                f"head_dim={self.head_dim}"
            )

    def positions(self, pos: Tensor) -> Tensor:
        """The positions the frequencies multiply, ``(B|1, L, m)`` (1-D ``(B, L)`` lifted)."""
        return pos[..., None] if pos.dim() == 2 else pos

    def _rotate_at(self, x: Tensor, pos: Tensor, role: str, seq_len: int | None) -> Tensor:
        self._check_head_dim(x, role)
        pos = self.positions(pos)
        if self.length_dependent and seq_len is None:
            seq_len = RoPE.call_length((f"{role}_pos", pos))
        freq, factor = self.angle_frequencies(x.device, seq_len)
        if freq.shape[0] > 1 and x.shape[1] != freq.shape[0]:
            # per-head frequencies and grouped keys: each query head sees its own rotation
            x = x.repeat_interleave(freq.shape[0] // x.shape[1], dim=1)
        ang = nd_angles(pos, freq)
        cos, sin = ang.cos(), ang.sin()
        if factor != 1.0:
            cos, sin = cos * factor, sin * factor
        return self.turn(x, cos, sin)

    def angle_frequencies(
        self, device: torch.device, seq_len: int | None = None
    ) -> tuple[Tensor, float]:
        """The frequencies of the angles ``rotate`` forms, ``(H|1, rows, m)``, and the
        attention factor: the pair frequency matrix (``frequency_matrix``) unless a subclass
        turns each channel by its own angle."""
        return self.frequency_matrix(device, seq_len)

    def turn(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """``x`` turned by the angles' cos and sin (rows of ``angle_frequencies``): rotary
        pairs in ``layout``."""
        return rotate_pairs(x, cos, sin, self.layout)

    def rotate(self, x: Tensor, pos: Tensor, role: str) -> Tensor:
        if role not in ("q", "k"):
            return x
        return self._rotate_at(x, pos, role, None)

    def rotate_qk(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> tuple[Tensor, Tensor]:
        if not self.length_dependent:
            return super().rotate_qk(q, k, q_pos, k_pos)
        # one set of frequencies for the queries and keys of a call: never mix two bases
        seq_len = RoPE.call_length(
            ("q_pos", self.positions(q_pos)), ("k_pos", self.positions(k_pos))
        )
        return self._rotate_at(q, q_pos, "q", seq_len), self._rotate_at(k, k_pos, "k", seq_len)

    def extra_repr(self) -> str:
        scaling = f", scaling={self.scaling}" if self.scaling else ""
        return f"{super().extra_repr()}, dims={self.dims}, layout={self.layout!r}{scaling}"


class AxialRoPE(SectionedRoPE):
    """Fixed one-hot frequency matrix: rotated pair ``p`` is driven by axis ``pair_axes()[p]``.

    ``spectrum`` (a class constant, module docstring): ``"per_axis"`` restarts the spectrum in
    every section (each axis is a RoPE over its ``2 n_a`` channels, and is scaled as one),
    ``"shared"`` takes pair ``i``'s frequency from one spectrum over the rotated channels.
    Subclass constructors call ``_set_sections(sections, dims, arg)``.
    """

    spectrum: ClassVar[str] = "shared"

    def _set_sections(self, sections: Sequence[int] | None, dims: int, arg: str) -> None:
        """Check and store the pairs per axis (default: an even split of the rotated pairs,
        remainder to the first axis) and build the frequencies."""
        sections = split_pairs(self.rotary_pairs, dims) if sections is None else list(sections)
        if len(sections) != dims:
            raise ValueError(f"{arg} must list {dims} non-negative pair counts, got {sections}")
        if sum(sections) > self.rotary_pairs:
            raise ValueError(
                f"{arg} {sections} rotates {sum(sections)} pairs but head_dim={self.head_dim} "
                f"has only {self.rotary_pairs} rotated pairs"
            )
        self.dims = dims
        self.sections = sections
        self.bases = _per_axis(self.base, dims, "base")
        if self.spectrum == "shared" and len(set(self.bases)) > 1:
            raise ValueError(f"base must be one number for a shared spectrum, got {self.base}")
        # float64, and not a buffer: ``module.to(torch.bfloat16)`` must never round the
        # frequencies (angles are formed in float64 whatever the activations are)
        self.freq, self.attention_factor = self.axial_frequencies(None)

    def pair_axes(self) -> Tensor:
        """The axis that drives each rotated pair, int64 ``(P,)``: contiguous sections."""
        return torch.repeat_interleave(torch.arange(self.dims), torch.tensor(self.sections))

    def axial_frequencies(self, seq_len: int | None) -> tuple[Tensor, float]:
        """``(F (1, P, m) float64, attention_factor)`` from the options (``seq_len``: for
        length-dependent scalings)."""
        kw = {"seq_len": seq_len, "max_position_embeddings": self.max_position_embeddings}
        if self.spectrum == "per_axis":
            parts = [
                rope_spectrum(2 * n, b, self.scaling, **kw)
                for n, b in zip(self.sections, self.bases, strict=True)
            ]
            freq = torch.cat([f for f, _ in parts])
            # the attention factor depends on the scaling dict only: equal on every axis
            factor = next((a for (_, a), n in zip(parts, self.sections, strict=True) if n), 1.0)
        else:
            freq, factor = rope_spectrum(
                self.head_dim,
                self.bases[0],
                self.scaling,
                partial_rotary_factor=self.partial_rotary_factor,
                **kw,
            )
            freq = freq[: sum(self.sections)]
        return one_hot_frequencies(freq, self.pair_axes(), self.dims)[None], factor

    def frequency_matrix(
        self, device: torch.device, seq_len: int | None = None
    ) -> tuple[Tensor, float]:
        if self.length_dependent and seq_len is not None:
            freq, factor = self.axial_frequencies(seq_len)
            return freq.to(device), factor
        return self.freq.to(device), self.attention_factor

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, sections={self.sections}, base={self.base}"


#: ``base`` of the per-axis encodings: one number, or one per axis
PER_AXIS_BASE = Custom(
    checker=check_number_or_sequence(above=1.0),
    invalid=[
        ("1e4", TypeError),
        (True, TypeError),
        (math.nan, ValueError),
        (1.0, ValueError),
        ([100.0, math.nan], ValueError),
    ],  # fmt: skip
    doc="rope_theta, or one per axis",
)
#: rotary pairs per axis (contiguous sections)
PAIR_COUNTS = IntSequence(minimum=0, optional=True, doc="rotary pairs per axis")


@register("rope-axial")
class RoPEAxial(AxialRoPE):
    """Axial N-D RoPE (RoPE-ViT, Heo et al. 2024; 3-D video RoPE of Wan2.1 / HunyuanVideo).

    Each axis drives its own contiguous section of pairs with its own spectrum
    ``theta_j = base_a^(-j / n_a)``. Defaults: 2 axes, pairs split evenly (remainder to the
    first axis, as Wan2.1 gives time the extra pairs), base 10000, interleaved layout (the
    RoPE-ViT code). RoPE-ViT: ``base=100`` (naver-ai/rope-vit); Wan2.1: ``dims=3``; HunyuanVideo:
    ``dims=3, sections=[8, 28, 28], base=256``. A ``scaling`` dict rescales every axis as a
    RoPE over its ``2 n_a`` channels (``max_position_embeddings`` / the dict's original length
    are then per-axis extents). Positions ``(B, L, dims)``, e.g. from
    ``relpos.positions_nd.grid_positions``.
    """

    paper = "Heo et al. 2024 (RoPE-ViT, axial); Wan2.1 / HunyuanVideo 3-D"
    dims = 2
    spectrum = "per_axis"
    default_layout = "interleaved"
    option_overrides = {"base": PER_AXIS_BASE}

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        dims: Annotated[int, Int(minimum=1)] = 2,
        sections: Annotated[Sequence[int] | None, PAIR_COUNTS] = None,
        **rope_options: Any,
    ) -> None:
        super().__init__(num_heads, head_dim, **rope_options)
        self._set_sections(sections, dims, "sections")


def turn_channels_half(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x`` with each of its first ``r = cos.shape[-1]`` channels turned by its own angle,
    half-split: ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x2, x1)``
    over the halves of the ``r`` channels (transformers' ``apply_rotary_pos_emb`` with
    per-channel cos/sin); channels ``r..D`` pass through. The arithmetic runs in ``x.dtype``.
    Shapes: ``x (..., L, D)``, ``cos, sin (..., L, r)``, ``r`` even and ``<= D``."""
    r = cos.shape[-1]
    if r % 2 or r > x.shape[-1]:
        raise ValueError(
            f"per-channel angles must cover an even number of channels <= {x.shape[-1]}, got {r}"
        )
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    rot, rest = x[..., :r], x[..., r:]
    x1, x2 = rot[..., : r // 2], rot[..., r // 2 :]
    out = rot * cos + torch.cat((-x2, x1), dim=-1) * sin
    return out if rest.shape[-1] == 0 else torch.cat((out, rest), dim=-1)


#: ``m-rope``'s explicit axis of every rotated pair
AXIS_OF_PAIR = IntSequence(
    minimum=0,
    maximum=2,
    optional=True,
    doc="axis (0=t, 1=h, 2=w) of each rotated pair, e.g. from rotary.mrope_layouts",
)


@register("m-rope")
class MRoPE(AxialRoPE):
    """Multimodal RoPE of Qwen2-VL (and Qwen3-VL's interleaved variant).

    One spectrum ``theta_i = base^(-2i/d)`` over all pairs; ``mrope_section`` (default
    ``[16, 24, 24]`` scaled to the rotated pairs) assigns contiguous pair bands to the
    (temporal, height, width) axes. ``interleaved_sections=True`` is Qwen3-VL: every pair
    starts on t, pairs ``i = 1 mod 3`` below ``3 * sections[1]`` take h, ``i = 2 mod 3`` below
    ``3 * sections[2]`` take w. Text tokens carry the same id on all three axes, which makes
    it plain RoPE there (also with a ``scaling``: YaRN, dynamic NTK, ... as Qwen2-VL's
    ``rope_parameters``). Positions ``(B, L, 3)`` from
    ``relpos.positions_nd.multimodal_position_ids``. Half-split layout (HF).

    A fourth section is llama.cpp's fourth position row e (``rope.dimension_sections = [t, h,
    w, e]``; ggml-org/llama.cpp ``ggml/src/ggml-cpu/ops.cpp``, ``ggml_mrope_cache_init``):
    positions are then ``(B, L, 4)``. Contiguous sections (llama.cpp ``MROPE``) give the last
    ``e`` pairs to e; with ``interleaved_sections=True`` (llama.cpp ``IMROPE``, Qwen3-VL's GGUF
    files) pair ``i`` takes h when ``i = 1 mod 3`` and ``i < 3 h``, w when ``i = 2 mod 3`` and
    ``i < 3 w``, t when ``i = 0 mod 3`` and ``i < 3 t``, and e otherwise, where transformers'
    three sections give those pairs to t: Qwen3-VL's ``[24, 20, 20, 0]`` over 64 pairs sends
    pairs 61 and 62 to e. llama.cpp fills e with 0 for every token its language model decodes
    (``llm_graph_input_pos::set_input`` in ``src/llama-graph.cpp`` for text,
    ``decode_embd_batch`` in ``tools/mtmd/mtmd-helper.cpp`` for images, video and audio), so
    pass the four rows as llama.cpp fills them (``relpos.interop.llama_cpp_rope
    .llama_cpp_positions``): positions relpos builds itself repeat one position on every axis.

    ``axis_of_pair`` gives the axis (0 = t, 1 = h, 2 = w) of every rotated pair instead of
    sections: one entry per rotated pair, pair ``p`` turning by ``pos[axis_of_pair[p]] *
    theta_p`` on the same shared spectrum. ``relpos.encodings.rotary.mrope_layouts`` builds
    the lists of Ernie 4.5 VL, Bailing / Ling and openPangu from their ``mrope_section``.

    ``section_split="channels"`` is HunYuanVL's split (transformers
    ``models/hunyuan_vl/modeling_hunyuan_vl.py``: ``HunYuanVLRotaryEmbedding.forward`` and
    ``recomposition_frequencies``): the sections split the doubled vector ``cat(theta,
    theta)`` over the ``2P`` rotated channels of the half layout into bands of ``2 *
    mrope_section[a]`` channels, band ``a`` driven by axis ``a``, so channel ``c`` turns by
    ``pos[a(c)] * theta_(c mod P)``. The two channels ``c`` and ``c + P`` of a pair can then
    take different axes: ``(x_c, x_(c+P)) -> (x_c cos u - x_(c+P) sin u, x_(c+P) cos v + x_c
    sin v)`` with ``u != v`` is linear but not a rotation, and the score is not a function of
    position differences (``relative`` is False unless every pair's two channels share an
    axis). A token with one position on every axis (text) gets plain RoPE. The sections must
    sum to the rotated pairs (HunYuanVL's config: ``head_dim / 2``), the layout is
    ``"half"``; three sections are HunYuanVL's (width, height, image index) axes, four its
    (position, width, height, image index). Its base: ``scaling={"rope_type": "ntk_alpha",
    "alpha": alpha}`` (transformers' ``compute_ntk_alpha_rope_parameters``).
    """

    paper = "Wang et al. 2024 (Qwen2-VL, M-RoPE)"
    dims = 3

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        mrope_section: Annotated[
            Sequence[int] | None,
            IntSequence(
                minimum=0, optional=True, doc="(t, h, w) pairs, or llama.cpp's (t, h, w, e)"
            ),
        ] = None,
        interleaved_sections: Annotated[
            bool, Bool(doc="Qwen3-VL's interleaved axis assignment")
        ] = False,
        axis_of_pair: Annotated[Sequence[int] | None, AXIS_OF_PAIR] = None,
        section_split: Annotated[
            str,
            Choice(
                ("pairs", "channels"),
                doc="sections count rotary pairs (Qwen2-VL), or split the doubled "
                "per-channel vector in 2 * section channels (HunYuanVL)",
            ),
        ] = "pairs",
        **rope_options: Any,
    ) -> None:
        super().__init__(num_heads, head_dim, **rope_options)
        self.interleaved_sections = interleaved_sections
        self.section_split = section_split
        if section_split == "channels":
            self._check_channel_split(axis_of_pair)
        self.axis_of_pair = None if axis_of_pair is None else tuple(axis_of_pair)
        if self.axis_of_pair is not None:
            mrope_section = self._sections_of_axis_list(self.axis_of_pair, mrope_section)
        if mrope_section is None:
            pairs = self.rotary_pairs
            t = pairs * 16 // 64
            mrope_section = [t, (pairs - t) // 2, pairs - t - (pairs - t) // 2]
        if len(mrope_section) not in (3, 4):
            raise ValueError(
                "mrope_section must list 3 pair counts (t, h, w) or 4 (llama.cpp's t, h, w, "
                f"e), got {list(mrope_section)}"
            )
        self._set_sections(mrope_section, len(mrope_section), "mrope_section")
        if section_split == "channels":
            if sum(self.sections) != self.rotary_pairs:
                raise ValueError(
                    f"mrope_section {list(self.sections)} with section_split='channels' must "
                    f"sum to the {self.rotary_pairs} rotated pairs of head_dim={head_dim} "
                    f"(its bands of 2 * section channels split all {2 * self.rotary_pairs} "
                    f"rotated channels)"
                )
            axes = self.channel_axes()
            # relative only when both channels of every pair are driven by one axis
            self.relative = bool(torch.equal(axes[: self.rotary_pairs], axes[self.rotary_pairs :]))

    def _check_channel_split(self, axis_of_pair: Sequence[int] | None) -> None:
        """``section_split="channels"`` against the other options (ValueError naming them)."""
        if self.layout != "half":
            raise ValueError(
                "section_split='channels' splits the half-layout vector cat(theta, theta) "
                f"(HunYuanVL): it needs layout='half', got layout={self.layout!r}"
            )
        if self.interleaved_sections:
            raise ValueError(
                "section_split='channels' gives contiguous channel bands; it cannot be combined "
                "with interleaved_sections=True (Qwen3-VL's cycle of pairs)"
            )
        if axis_of_pair is not None:
            raise ValueError(
                "section_split='channels' gives each channel its axis from mrope_section; it "
                "cannot be combined with axis_of_pair (one axis per pair)"
            )

    def channel_axes(self) -> Tensor:
        """With ``section_split="channels"``: the axis that drives each of the ``2P`` rotated
        channels (half layout), int64 ``(2P,)``: bands of ``2 * mrope_section[a]``."""
        counts = 2 * torch.tensor(self.sections)
        return torch.repeat_interleave(torch.arange(self.dims), counts)

    def frequency_matrix(
        self, device: torch.device, seq_len: int | None = None
    ) -> tuple[Tensor, float]:
        if self.section_split == "channels":
            raise ValueError(
                "m-rope with section_split='channels' turns the two channels of a pair by "
                "different axes (not a rotation of pairs): it has no pair frequency matrix; "
                "its per-channel frequencies are angle_frequencies"
            )
        return super().frequency_matrix(device, seq_len)

    def angle_frequencies(
        self, device: torch.device, seq_len: int | None = None
    ) -> tuple[Tensor, float]:
        """Pairs: ``frequency_matrix``. Channels: ``(1, 2P, m)`` float64, row ``c`` the
        frequency ``theta_(c mod P)`` on the axis ``channel_axes()[c]``."""
        if self.section_split == "pairs":
            return super().angle_frequencies(device, seq_len)
        pair_freq, factor = super().frequency_matrix(device, seq_len)
        theta = pair_freq[0].sum(-1).cpu()  # one non-zero per row: the pair's frequency
        rows = one_hot_frequencies(theta.repeat(2), self.channel_axes(), self.dims)
        return rows[None].to(device), factor

    def turn(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        if self.section_split == "pairs":
            return super().turn(x, cos, sin)
        return turn_channels_half(x, cos, sin)

    def _sections_of_axis_list(
        self, axes: tuple[int, ...], mrope_section: Sequence[int] | None
    ) -> list[int]:
        """Check ``axis_of_pair`` against the other options; its pairs per axis."""
        if self.interleaved_sections:
            raise ValueError(
                "axis_of_pair gives the axis of every pair; it cannot be combined with "
                "interleaved_sections=True (Qwen3-VL's cycle)"
            )
        if mrope_section is not None:
            raise ValueError(
                "axis_of_pair gives the axis of every pair; pass it without mrope_section "
                f"(got mrope_section={list(mrope_section)})"
            )
        if len(axes) != self.rotary_pairs:
            raise ValueError(
                f"axis_of_pair must give one axis per rotated pair: {self.rotary_pairs} for "
                f"head_dim={self.head_dim}, partial_rotary_factor="
                f"{self.partial_rotary_factor:g}; got {len(axes)}"
            )
        return [axes.count(axis) for axis in range(3)]

    def pair_axes(self) -> Tensor:
        if self.axis_of_pair is not None:
            return torch.tensor(self.axis_of_pair, dtype=torch.long)
        if not self.interleaved_sections:
            return super().pair_axes()
        t, h, w = self.sections[:3]
        i = torch.arange(sum(self.sections))
        # transformers' three sections: t by default; llama.cpp's four: e by default, t only
        # on its own interleaved slots
        axis = torch.full((len(i),), 0 if self.dims == 3 else 3, dtype=torch.long)
        if self.dims == 4:
            axis[(i % 3 == 0) & (i < 3 * t)] = 0
        axis[(i % 3 == 1) & (i < 3 * h)] = 1
        axis[(i % 3 == 2) & (i < 3 * w)] = 2
        return axis

    def positions(self, pos: Tensor) -> Tensor:
        """The positions ``(B|1, L, dims)``; ``ValueError`` naming the expected axes."""
        pos = super().positions(pos)
        if pos.shape[-1] != self.dims:
            axes = "(t, h, w)" if self.dims == 3 else "(t, h, w, e)"
            if self.section_split == "channels":
                axes = "of its sections, in order"
            raise ValueError(
                f"m-rope with mrope_section={list(self.sections)} takes positions "
                f"(B, L, {self.dims}) on the axes {axes}, got shape {tuple(pos.shape)}"
            )
        return pos


@register("rope-hierarchical")
class HierarchicalRoPE(AxialRoPE):
    """Hierarchical RoPE (hRoPE / HiRoPE): paragraph, sentence and token channels.

    No code was found for hRoPE or HiRoPE; both abstracts describe sectioned channels, so this is a
    reconstruction: sectioned RoPE (as M-RoPE) with one shared spectrum. Assumed: positions
    ``(B, L, 3)`` are (token, sentence, paragraph) indices
    (``relpos.positions_nd.hierarchical_positions``), and the first section (highest frequencies)
    goes to the finest level; ``sections`` sets the pairs per level (default an even split,
    remainder to the token level) and ``levels`` the number of levels. Half-split layout by default
    (as ``rope``).
    """

    paper = "hRoPE / HiRoPE (hierarchical positions; abstract only)"
    dims = 3

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        sections: Annotated[Sequence[int] | None, PAIR_COUNTS] = None,
        levels: Annotated[int, Int(minimum=1, doc="position axes")] = 3,
        **rope_options: Any,
    ) -> None:
        super().__init__(num_heads, head_dim, **rope_options)
        self._set_sections(sections, levels, "sections")


@register("rope-2d-normalized")
class NormalizedRoPE2D(AxialRoPE):
    """Normalised 2-D RoPE for scale-wise autoregressive generation (STAR; Infinity's
    ``rope2d_normalized_by_hw=2``, "star style": STAR released no code, Infinity's was read,
    FoundationVision/Infinity ``infinity/models/basic.py``).

    Every scale's grid is mapped into the frame of the largest grid ``reference_grid =
    (uph, upw)``: positions are given *normalised* (row / ph, col / pw), e.g. from
    ``relpos.positions_nd.scale_positions``, and the encoding uses
    ``round(r * uph / ph), round(c * upw / pw)`` (``rounding=True``, the Infinity code) or the
    unrounded product (``rounding=False``: exactly relative, continuous). First half of the
    pairs rows, second half columns, ``theta_j = base^(-j / (d/4))``, interleaved pairs (the
    Infinity code). A ``scaling`` dict rescales each axis as ``rope-axial`` does.
    """

    paper = "STAR (scale-wise AR, normalised 2-D RoPE); Infinity mode 2"
    dims = 2
    relative = False  # with rounding; the instance says True when rounding=False
    spectrum = "per_axis"
    default_layout = "interleaved"  # the Infinity code

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        reference_grid: Annotated[
            Sequence[int], IntSequence(length=2, minimum=1, doc="(rows, cols) of the frame")
        ] = (16, 16),
        rounding: Annotated[bool, Bool(doc="round to the reference grid (Infinity)")] = True,
        **rope_options: Any,
    ) -> None:
        super().__init__(num_heads, head_dim, **rope_options)
        self._set_sections(None, 2, "sections")
        self.reference_grid = list(reference_grid)
        self.rounding = rounding
        self.relative = not rounding

    def positions(self, pos: Tensor) -> Tensor:
        """Normalised positions mapped into the reference frame (rounded with ``rounding``)."""
        scaled = pos.to(torch.float64) * torch.tensor(
            self.reference_grid, dtype=torch.float64, device=pos.device
        )
        return torch.round(scaled).long() if self.rounding else scaled


@register("rope-mixed")
class RoPEMixed(SectionedRoPE):
    """RoPE-Mixed (Heo et al. 2024): learnable 2-D frequencies per head.

    ``angle[h, p] = t_x f_x[h, p] + t_y f_y[h, p]`` with ``f (H, r/2, 2)`` a parameter
    (exclude it from weight decay; ``r = head_dim`` or ``int(head_dim * p)`` with
    ``partial_rotary_factor``). Init (naver-ai/rope-vit ``init_random_2d_freqs``): per head
    ``alpha ~ U(0, 2 pi)``, magnitudes ``mag_j = base^(-4j/r)`` (``j < r/4``, base 10),
    ``f_x = [mag cos(alpha), mag cos(pi/2 + alpha)]``, ``f_y = [mag sin(alpha),
    mag sin(pi/2 + alpha)]``. Interleaved pairs (the RoPE-ViT code). Positions ``(B, L, 2)`` =
    (x, y). The frequencies are learned, so a ``scaling`` dict (and the trained length it
    reads) is refused by name.
    """

    paper = "Heo et al. 2024 (RoPE-ViT, RoPE-Mixed)"
    dims = 2
    cache_rotated_keys = False  # grouped keys are expanded to the query heads when rotated
    default_base = 10.0  # naver-ai/rope-vit's magnitudes
    default_layout = "interleaved"  # the RoPE-ViT code
    option_overrides = {
        "scaling": Refused(
            "RoPE-Mixed learns its frequencies per head; there is no fixed RoPE spectrum for "
            "an HF scaling dict to rescale (use rope-axial)"
        ),
        "max_position_embeddings": Refused(
            "RoPE-Mixed takes no scaling, which is what reads the trained length"
        ),
    }

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        **rope_options: Any,
    ) -> None:
        super().__init__(num_heads, head_dim, **rope_options)
        rotated = 2 * self.rotary_pairs
        if rotated % 4:
            raise ValueError(
                f"head_dim must be a multiple of 4 for RoPE-Mixed (rotated channels: "
                f"{rotated} of head_dim={head_dim})"
            )
        quarter = rotated // 4
        mag = float(self.base) ** (-4 * torch.arange(quarter, dtype=torch.float64) / rotated)
        alpha = torch.rand(num_heads, 1, dtype=torch.float64) * 2 * math.pi
        fx = torch.cat((mag * torch.cos(alpha), mag * torch.cos(math.pi / 2 + alpha)), dim=-1)
        fy = torch.cat((mag * torch.sin(alpha), mag * torch.sin(math.pi / 2 + alpha)), dim=-1)
        self.freq = nn.Parameter(torch.stack((fx, fy), dim=-1).float())  # (H, r/2, 2)

    def frequency_matrix(
        self, device: torch.device, seq_len: int | None = None
    ) -> tuple[Tensor, float]:
        return self.freq, 1.0


TIME_SCALE = Custom(
    checker=check_number_or_sequence(above=0.0),
    invalid=[
        ("1", TypeError),
        (math.nan, ValueError),
        (0.0, ValueError),
        ([1.0, -2.0], ValueError),
    ],  # fmt: skip
    doc="positions are multiplied by it (one number, or one per axis)",
)


@register("time-rope")
class TimeRoPE(AxialRoPE):
    """Continuous-time RoPE (DuET / TPRoPE; abstract only, no code): real-valued timestamps.

    ``angle_i = tau * time_scale * theta_i``, ``theta_i = base^(-2i/d)``, with float positions
    ``tau`` (seconds, MIDI ticks) formed in float64 (never bf16). ``sections`` with more than
    one entry adds axes in the M-RoPE way (TPRoPE: time and pitch share one spectrum, each
    driving its band of pairs); ``time_scale`` may then be one number per axis. Half-split
    layout by default (as ``rope``); a ``scaling`` dict rescales the shared spectrum, and
    length-dependent scalings read the largest ``tau * time_scale`` of the call.
    """

    paper = "DuET / TPRoPE (continuous-time positions; abstract only)"
    dims = 1

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        time_scale: Annotated[float | Sequence[float], TIME_SCALE] = 1.0,
        sections: Annotated[Sequence[int] | None, PAIR_COUNTS] = None,
        **rope_options: Any,
    ) -> None:
        super().__init__(num_heads, head_dim, **rope_options)
        dims = 1 if sections is None else len(sections)
        self.time_scale = _per_axis(time_scale, dims, "time_scale")
        self._set_sections(sections, dims, "sections")

    def positions(self, pos: Tensor) -> Tensor:
        """Timestamps times ``time_scale`` (float64), per axis."""
        pos = super().positions(pos)
        if all(s == 1.0 for s in self.time_scale):
            return pos
        return pos.to(torch.float64) * torch.tensor(
            self.time_scale, dtype=torch.float64, device=pos.device
        )
