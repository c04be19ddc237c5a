"""Rotary encodings: RoPE (half-split / interleaved, partial) and xPos.

RoPE (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding"):
each channel pair of q and k is rotated by ``p * theta_i``, ``theta_i = base^(-2i/d)``, so
``<R(m) q, R(n) k> = <q, R(n - m) k>`` depends on the distance only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ... import config
from ...functional import apply_rotary, apply_rotary_fused, rope_angles, rope_frequencies
from ...registry import register
from ...rope_scaling import is_length_dependent
from ..base import Encoding
from ..options import Choice, Custom, Float, Int


def check_scaling_dict(value: object, name: str) -> dict:
    """An HF ``rope_scaling`` / ``rope_parameters`` dict (copied); its keys are checked
    against the head size by ``rope_frequencies`` when the encoding builds its frequencies."""
    if not isinstance(value, dict):
        raise TypeError(
            f"{name} must be an HF rope_scaling dict such as {{'rope_type': 'yarn', "
            f"'factor': 4.0, 'original_max_position_embeddings': 2048}}, got {value!r}"
        )
    return dict(value)


#: the options every rotary encoding takes (declared once; subclasses inherit them)
ROPE_OPTIONS = {
    "base": Float(above=1.0, doc="rope_theta"),
    "layout": Choice(("half", "interleaved"), doc="channel pairing"),
    "partial_rotary_factor": Float(above=0.0, maximum=1.0, doc="fraction of rotated channels"),
    "scaling": Custom(
        checker=check_scaling_dict,
        invalid=[("yarn", TypeError), ({"rope_type": "no-such-type"}, ValueError)],
        optional=True,
        doc="HF rope_scaling dict",
    ),
    "max_position_embeddings": Int(optional=True, doc="the model's trained length"),
}


def rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
    """``apply_rotary``, through the compiled kernel when ``relpos.config`` asks for it."""
    fused = config.FUSED_ROTARY
    if fused is True or (fused == "auto" and x.numel() >= config.FUSED_ROTARY_MIN_NUMEL):
        return apply_rotary_fused(x, cos, sin, layout)
    return apply_rotary(x, cos, sin, layout)


@register("rope")
class RoPE(Encoding):
    """Rotary position embedding (Su et al. 2021, arXiv 2104.09864).

    Args:
        base: ``rope_theta`` (10000).
        layout: ``"half"`` pairs ``(x_i, x_{i+r/2})`` (GPT-NeoX / HF Llama) or
            ``"interleaved"`` pairs ``(x_{2i}, x_{2i+1})`` (RoFormer, GPT-J, Meta Llama).
        partial_rotary_factor: rotate the first ``r = int(head_dim * p)`` channels with
            frequencies spread over ``r`` (GPT-NeoX convention); the rest pass through.
        scaling: an HF ``rope_scaling`` / ``rope_parameters`` dict (``relpos.rope_scaling``:
            linear, ntk, dynamic, yarn, llama3, longrope, proportional).
        max_position_embeddings: the model-config length HF reads besides the dict (dynamic
            NTK's reference length, YaRN's factor, LongRoPE's switch).

    Length-dependent scalings (dynamic NTK, LongRoPE) take their frequencies from the largest
    position of each call, for queries and keys together; such an encoding sets
    ``cache_rotated_keys = False`` so ``relpos.nn`` re-rotates the cache and one call never
    mixes two bases (HF keeps stale rotations in its cache instead; spec P3).

    Formula: for pair ``(a, b)`` at position p: ``(a cos(p theta_i) - b sin(p theta_i),
    a sin(p theta_i) + b cos(p theta_i))``. Angles are float32 (``functional.rope_angles``:
    float64 products, reduced modulo 2 pi for fractional positions or positions > 2^16).
    Shapes: ``x (B, H, L, D)``, ``pos (B|1, L)``.
    """

    family = "rotary"
    paper = "Su et al. 2021 (RoFormer)"
    has_rotary = True
    continuous = True
    options = ROPE_OPTIONS

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        base: float = 10000.0,
        layout: str = "half",
        partial_rotary_factor: float = 1.0,
        scaling: dict | None = None,
        max_position_embeddings: int | None = None,
    ) -> None:
        super().__init__(num_heads, head_dim)
        if layout not in ("half", "interleaved"):
            raise ValueError(f"layout must be 'half' or 'interleaved', got {layout!r}")
        self.base = float(base)
        self.layout = layout
        self.partial_rotary_factor = float(partial_rotary_factor)
        self.scaling = dict(scaling) if scaling is not None else None
        self.max_position_embeddings = max_position_embeddings
        self.length_dependent = is_length_dependent(scaling)
        if self.length_dependent:
            # Frequencies follow the length of each call: cache raw keys, re-rotate (spec P3).
            self.cache_rotated_keys = False
        inv_freq, attention_factor = self.frequencies(None)
        self.attention_factor = float(attention_factor)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def frequencies(self, seq_len: int | None) -> tuple[Tensor, float]:
        """``(inv_freq, attention_factor)`` for a call whose largest position is ``seq_len - 1``
        (only length-dependent scalings, dynamic NTK and LongRoPE, read ``seq_len``)."""
        return rope_frequencies(
            self.head_dim,
            self.base,
            self.scaling,
            seq_len=seq_len,
            max_position_embeddings=self.max_position_embeddings,
            partial_rotary_factor=self.partial_rotary_factor,
        )

    @property
    def rotary_dim(self) -> int:
        """Number of rotated channels ``r`` (even)."""
        return 2 * self.inv_freq.numel()

    def cos_sin(self, pos: Tensor, seq_len: int | None = None) -> tuple[Tensor, Tensor]:
        """``cos, sin`` of shape ``(B|1, 1, L, r/2)`` float32 for positions ``(B|1, L)``.

        ``seq_len`` selects the frequencies of length-dependent scalings (default: the
        largest position in ``pos`` + 1, as HF counts it).
        """
        inv_freq, factor = self.inv_freq, self.attention_factor
        if self.length_dependent:
            if seq_len is None:
                seq_len = int(pos.max()) + 1 if pos.numel() else 1
            inv_freq, factor = self.frequencies(seq_len)
            inv_freq = inv_freq.to(pos.device)
        ang = rope_angles(pos, inv_freq)[:, None]
        cos, sin = ang.cos(), ang.sin()
        if factor != 1.0:
            cos, sin = cos * factor, sin * factor
        return cos, sin

    def rotate_qk(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> tuple[Tensor, Tensor]:
        if not self.length_dependent:
            return super().rotate_qk(q, k, q_pos, k_pos)
        # One set of frequencies for queries and keys of the call: never mix bases.
        seq_len = int(torch.maximum(q_pos.max(), k_pos.max())) + 1
        self._check_qk(q, k)
        return self._rotate_at(q, q_pos, seq_len), self._rotate_at(k, k_pos, seq_len)

    def _check_head_dim(self, x: Tensor, role: str, what: str = "head_dim") -> None:
        """``ValueError`` naming ``role`` unless the last dim of ``x`` is ``head_dim``."""
        if x.shape[-1] != self.head_dim:
            raise ValueError(
                f"{role} has {what} {x.shape[-1]} but the encoding was created with "
                f"head_dim={self.head_dim}"
            )

    def _check_qk(self, q: Tensor, k: Tensor) -> None:
        self._check_head_dim(q, "q")
        self._check_head_dim(k, "k")

    def _rotate_at(
        self, x: Tensor, pos: Tensor, seq_len: int | None = None, *, inverse: bool = False
    ) -> Tensor:
        """``x`` rotated by ``R(pos)`` (``R(pos)^T`` with ``inverse``), ``cos_sin``'s angles."""
        cos, sin = self.cos_sin(pos, seq_len)
        return rotate_pairs(x, cos, -sin if inverse else sin, self.layout)

    def rotate(self, x: Tensor, pos: Tensor, role: str) -> Tensor:
        if role not in ("q", "k"):
            return x
        self._check_head_dim(x, role)
        return self._rotate_at(x, pos)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, base={self.base:g}, layout={self.layout!r}, "
            f"rotary_dim={self.rotary_dim}"
        )


@register("xpos")
class XPos(RoPE):
    """xPos / LeX Transformer (Sun et al. 2022, arXiv 2212.10554; torchscale ``XPOS``).

    RoPE (interleaved layout, as in torchscale) times a per-pair exponential scale:
    ``zeta_i = (2i + 0.4 d) / (1.4 d)``; query at n: ``RoPE(q, n) * zeta^((n - c) / B)``; key at
    m: ``RoPE(k, m) * zeta^(-(m - c) / B)``. The score then carries ``zeta_i^((n - m)/B)``,
    which decays with distance for keys in the past: xPos is causal. ``B = scale_base``
    (512). The centre ``c`` cancels in q.k; relpos takes the midpoint of the key positions
    of each call so the factors neither overflow nor underflow, and therefore asks
    ``relpos.nn`` to cache raw keys (``cache_rotated_keys = False``).
    """

    paper = "Sun et al. 2022 (xPos)"
    causal_only = True
    continuous = False
    cache_rotated_keys = False

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        base: float = 10000.0,
        scale_base: float = 512.0,
        layout: str = "interleaved",
    ) -> None:
        super().__init__(num_heads, head_dim, base=base, layout=layout)
        if not scale_base > 0:
            raise ValueError(f"scale_base must be > 0, got {scale_base!r}")
        self.scale_base = float(scale_base)
        d = head_dim
        zeta = (torch.arange(0, d, 2, dtype=torch.float64) + 0.4 * d) / (1.4 * d)
        self.register_buffer("zeta", zeta.float(), persistent=False)

    def _envelope(self, pos: Tensor, center: Tensor, sign: float) -> Tensor:
        """The per-pair factor ``zeta^(sign (pos - center) / B)``: ``(B|1, 1, L, r/2)``
        float32 (``sign`` +1 for queries, -1 for keys)."""
        rel = (pos.to(torch.float64) - center)[:, None, :, None] * (sign / self.scale_base)
        return torch.pow(self.zeta.to(torch.float64), rel).to(torch.float32)

    def _scaled(self, x: Tensor, pos: Tensor, center: Tensor, sign: float) -> Tensor:
        cos, sin = self.cos_sin(pos)
        scale = self._envelope(pos, center, sign)
        return rotate_pairs(x, cos * scale, sin * scale, self.layout)

    def rotate_qk(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> tuple[Tensor, Tensor]:
        self._check_qk(q, k)
        center = (k_pos.min().to(torch.float64) + k_pos.max().to(torch.float64)) / 2
        center = torch.floor(center)
        return self._scaled(q, q_pos, center, 1.0), self._scaled(k, k_pos, center, -1.0)

    def rotate(self, x: Tensor, pos: Tensor, role: str) -> Tensor:
        if role not in ("q", "k"):
            return x
        self._check_head_dim(x, role)
        zero = torch.zeros((), dtype=torch.float64, device=pos.device)
        return self._scaled(x, pos, zero, 1.0 if role == "q" else -1.0)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scale_base={self.scale_base:g}"
