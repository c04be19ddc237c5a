"""RoPE (half-split / interleaved, partial, HF scaling) and the options every rotary
encoding shares.

RoPE (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding"):
each channel pair of q and k is rotated by ``p * theta_i``, ``theta_i = base^(-2i/d)``, so
``<R(m) q, R(n) k> = <q, R(n - m) k>`` depends on the distance only.

``RoPE`` declares the common options once, in its signature (``base``, ``layout``,
``partial_rotary_factor``, ``rotary_channels``, ``scaling``, ``max_position_embeddings``);
every subclass takes
them as ``**rope_options`` and passes them on (so it inherits their specs), or refuses one
it cannot honour (``option_overrides = {name: Refused(reason)}``). Subclasses change RoPE
through three hooks, so every option composes with them:

* ``frequencies(seq_len)``: the frequency set (HoPE and p-RoPE mask it); called at init and,
  for length-dependent scalings (dynamic NTK, LongRoPE), once per call;
* ``angle_frequencies(inv_freq)``: a learned change applied at call time (LeRoPE);
* ``cos_sin(pos, seq_len)``: the rotation itself (xPos multiplies an envelope).

Default layouts (``layout=``): ``half`` (GPT-NeoX / HF Llama pairing) for ``rope``, the
frequency variants, RoVE, CARoPE, hyperbolic-rope and ComplexFormer (whose complex split
needs it); ``interleaved`` for ``xpos`` (torchscale) and ``harope`` (the official code).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated

import torch
from torch import Tensor

from ... import config
from ...functional import (
    apply_rotary,
    apply_rotary_fused,
    apply_rotary_pair,
    apply_rotary_pair_fused,
    rope_angles,
    rope_frequencies,
)
from ...rope_scaling import is_length_dependent, validate_scaling
from ..base import Encoding
from ..options import Choice, Custom, Float, Int
from ..registry import register


def check_scaling_dict(value: object, name: str) -> dict:
    """An HF ``rope_scaling`` / ``rope_parameters`` dict (copied), its type, keys and ranges
    checked by ``relpos.rope_scaling.validate_scaling`` (errors name ``name``). What needs the
    head size or the model length (LongRoPE's factor lengths, YaRN's original length) is
    checked when the encoding builds its frequencies."""
    if not isinstance(value, Mapping):
        raise TypeError(
            f"{name} must be an HF rope_scaling dict such as {{'rope_type': 'yarn', "
            f"'factor': 4.0, 'original_max_position_embeddings': 2048}}, got {value!r}"
        )
    try:
        validate_scaling(value, require_original=False)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None
    return dict(value)


def refuse_length_dependent(reason: str):
    """A ``scaling`` checker for methods that can take static scalings only: a dynamic NTK or
    LongRoPE dict raises ``ValueError`` naming the option and ``reason``."""

    def check(value: object, name: str) -> dict:
        value = check_scaling_dict(value, name)
        if is_length_dependent(value):
            raise ValueError(
                f"{name}: length-dependent scaling {value.get('rope_type') or value.get('type')!r} "
                f"is not supported here: {reason}"
            )
        return value

    return check


def scaling_option(
    checker=check_scaling_dict, doc: str = "HF rope_scaling dict", refused: tuple = ()
) -> Custom:
    """The declared ``scaling`` option with ``checker`` (default: any valid HF dict);
    ``refused``: further dicts the checker refuses (``ValueError``), as test examples."""
    invalid = [
        ("yarn", TypeError),
        ({"rope_type": "no-such-type"}, ValueError),
        ({"rope_type": "linear", "factor": 0.5}, ValueError),
        ({"rope_type": "linear", "factor": float("nan")}, ValueError),
        *((value, ValueError) for value in refused),
    ]
    return Custom(checker=checker, invalid=invalid, optional=True, doc=doc)


#: the specs of the options every rotary encoding takes: ``RoPE`` declares them in its
#: signature, its subclasses pass them on (``**rope_options``) and inherit them; an encoding
#: that takes one itself (``SectionedRoPE``) annotates its parameter with the same spec
ROPE_BASE = Float(above=1.0, doc="rope_theta")
ROPE_LAYOUT = Choice(("half", "interleaved"), doc="channel pairing")
ROPE_PARTIAL_ROTARY_FACTOR = Float(above=0.0, maximum=1.0, doc="fraction of rotated channels")
ROPE_ROTARY_CHANNELS = Choice(("first", "last"), doc="where the rotated channels sit in the head")
ROPE_SCALING = scaling_option()
ROPE_MAX_POSITION_EMBEDDINGS = Int(optional=True, doc="the model's trained length")


def rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
    """``apply_rotary``, through the compiled kernel when ``relpos.config`` asks for it."""
    fused = config.FUSED_ROTARY
    if fused is True or (fused == "auto" and x.numel() >= config.FUSED_ROTARY_MIN_NUMEL):
        return apply_rotary_fused(x, cos, sin, layout)
    return apply_rotary(x, cos, sin, layout)


def rotate_pair(
    q: Tensor, k: Tensor, q_cs: tuple[Tensor, Tensor], k_cs: tuple[Tensor, Tensor], layout: str
) -> tuple[Tensor, Tensor]:
    """``rotate_pairs`` of q and k in one call (one compiled graph when fused)."""
    fused = config.FUSED_ROTARY
    big = q.numel() + k.numel() >= config.FUSED_ROTARY_MIN_NUMEL
    if fused is True or (fused == "auto" and big):
        return apply_rotary_pair_fused(q, k, *q_cs, *k_cs, layout)
    return apply_rotary_pair(q, k, *q_cs, *k_cs, layout)


def same_positions(a: Tensor, b: Tensor) -> bool:
    """Whether two position tensors are the same (identity, or equal shape and values)."""
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b))


@register("rope")
class RoPE(Encoding):
    """Rotary position embedding (Su et al. 2021, arXiv 2104.09864).

    Args:
        base: ``rope_theta`` (10000).
        layout: ``"half"`` pairs ``(x_i, x_{i+r/2})`` (GPT-NeoX / HF Llama) or
            ``"interleaved"`` pairs ``(x_{2i}, x_{2i+1})`` (RoFormer, GPT-J, Meta Llama).
        partial_rotary_factor: rotate ``r = int(head_dim * p)`` channels with frequencies
            spread over ``r`` (GPT-NeoX convention); the rest pass through.
        rotary_channels: ``"first"``: the rotated channels are the first ``r`` of the head
            (GPT-NeoX, HF Llama, Phi); ``"last"``: the last ``r``, the head laid out
            ``[pass-through | rotated]`` (DeepSeek-V4: transformers' ``deepseek_v4``
            ``apply_rotary_pos_emb``, vLLM's ``DeepseekV4ScalingRotaryEmbedding`` in
            ``vllm/model_executor/layers/rotary_embedding/deepseek_scaling_rope.py``). Only
            encodings that rotate through RoPE's own ``cos_sin`` / ``rotate`` path honour
            ``"last"`` (rope, its frequency variants, RoVE); the others refuse it by name.
        scaling: an HF ``rope_scaling`` / ``rope_parameters`` dict (``relpos.rope_scaling``:
            linear, ntk, dynamic, yarn, llama3, longrope, proportional).
        max_position_embeddings: the model-config length HF reads besides the dict (dynamic
            NTK's reference length, YaRN's factor, LongRoPE's switch).

    Length-dependent scalings (dynamic NTK, LongRoPE) take their frequencies from the largest
    position of each call, for queries and keys together; such an encoding sets
    ``cache_rotated_keys = False`` so ``relpos.nn`` re-rotates the cache and one call never
    mixes two bases (HF keeps stale rotations in its cache instead).

    Formula: for pair ``(a, b)`` at position p: ``(a cos(p theta_i) - b sin(p theta_i),
    a sin(p theta_i) + b cos(p theta_i))``. Angles are float32 (``functional.rope_angles``:
    float64 products, reduced modulo 2 pi for fractional positions or positions > 2^16).
    Shapes: ``x (B, H, L, D)``, ``pos (B|1, L)``.
    """

    paper = "Su et al. 2021 (RoFormer)"
    has_rotary = True
    continuous = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        base: Annotated[float, ROPE_BASE] = 10000.0,
        layout: Annotated[str, ROPE_LAYOUT] = "half",
        partial_rotary_factor: Annotated[float, ROPE_PARTIAL_ROTARY_FACTOR] = 1.0,
        rotary_channels: Annotated[str, ROPE_ROTARY_CHANNELS] = "first",
        scaling: Annotated[dict | None, ROPE_SCALING] = None,
        max_position_embeddings: Annotated[int | None, ROPE_MAX_POSITION_EMBEDDINGS] = None,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.base = base
        self.layout = layout
        self.partial_rotary_factor = partial_rotary_factor
        if rotary_channels == "last" and not self._rotates_through_rope():
            raise ValueError(
                f"rotary_channels='last' is not supported by {type(self).__name__}: it rotates "
                "q and k its own way, on the first channels of the head; use "
                "rotary_channels='first'"
            )
        self.rotary_channels = rotary_channels
        self.scaling = scaling
        self.max_position_embeddings = max_position_embeddings
        self.length_dependent = is_length_dependent(scaling)
        if self.length_dependent:
            # Frequencies follow the length of each call: cache raw keys, re-rotate.
            self.cache_rotated_keys = False
        inv_freq, attention_factor = self.frequencies(None)
        self.attention_factor = float(attention_factor)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    # ----------------------------------------------------------------- frequency hooks
    def frequencies(self, seq_len: int | None) -> tuple[Tensor, float]:
        """``(inv_freq, attention_factor)`` for a call whose largest position is ``seq_len - 1``
        (only length-dependent scalings, dynamic NTK and LongRoPE, read ``seq_len``).
        Subclasses that change the frequency set (HoPE, p-RoPE) override this."""
        return rope_frequencies(
            self.head_dim,
            self.base,
            self.scaling,
            seq_len=seq_len,
            max_position_embeddings=self.max_position_embeddings,
            partial_rotary_factor=self.partial_rotary_factor,
        )

    def angle_frequencies(self, inv_freq: Tensor) -> Tensor:
        """The frequencies the angles use, from the (scaled) ``inv_freq (r/2,)``: a learned
        change applied at call time (LeRoPE). Identity here."""
        return inv_freq

    def call_frequencies(self, seq_len: int | None, device: torch.device) -> tuple[Tensor, float]:
        """``(inv_freq, attention_factor)`` of a call: the stored ones, or for a
        length-dependent scaling those of ``seq_len``; then ``angle_frequencies``."""
        inv_freq, factor = self.inv_freq, self.attention_factor
        if self.length_dependent and seq_len is not None:
            inv_freq, factor = self.frequencies(seq_len)
            inv_freq = inv_freq.to(device)
        return self.angle_frequencies(inv_freq), factor

    @property
    def rotary_dim(self) -> int:
        """Number of rotated channels ``r`` (even)."""
        return 2 * self.inv_freq.numel()

    @staticmethod
    def call_length(*named_positions: tuple[str, Tensor]) -> int:
        """``seq_len`` of a call as HF counts it: the largest position + 1 over all the
        ``(name, positions)`` given; non-finite or negative positions raise ``ValueError``
        naming them (length-dependent scalings read a length, not a position)."""
        largest = 0
        for name, pos in named_positions:
            if pos.numel() == 0:
                continue
            if pos.is_floating_point() and not bool(torch.isfinite(pos).all()):
                raise ValueError(
                    f"{name} must be finite for a length-dependent rope scaling (dynamic NTK, "
                    f"LongRoPE reads the largest position), got non-finite positions"
                )
            low, high = pos.min(), pos.max()
            if low < 0:
                raise ValueError(
                    f"{name} must be >= 0 for a length-dependent rope scaling (its length is "
                    f"the largest position + 1), got {low.item()!r}"
                )
            largest = max(largest, math.floor(float(high)) + 1)
        return max(largest, 1)

    def cos_sin(self, pos: Tensor, seq_len: int | None = None) -> tuple[Tensor, Tensor]:
        """``cos, sin`` of shape ``(B|1, 1, L, r/2)`` float32 for positions ``(B|1, L)``,
        both multiplied by the scaling's attention factor.

        ``seq_len`` selects the frequencies of length-dependent scalings (default: the
        largest position in ``pos`` + 1, as HF counts it).
        """
        if self.length_dependent and seq_len is None:
            seq_len = self.call_length(("pos", pos))
        inv_freq, factor = self.call_frequencies(seq_len, pos.device)
        ang = rope_angles(pos, inv_freq)[:, None]
        cos, sin = ang.cos(), ang.sin()
        if factor != 1.0:
            cos, sin = cos * factor, sin * factor
        return cos, sin

    def rotate_qk(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> tuple[Tensor, Tensor]:
        # One set of frequencies for queries and keys of the call: never mix bases.
        seq_len = None
        if self.length_dependent:
            seq_len = self.call_length(("q_pos", q_pos), ("k_pos", k_pos))
        cls = type(self)
        if cls.rotate is not RoPE.rotate or cls._rotate_at is not RoPE._rotate_at:
            # a subclass that rotates its own way: one tensor at a time
            if not self.length_dependent:
                return super().rotate_qk(q, k, q_pos, k_pos)
            self._check_qk(q, k)
            return self._rotate_at(q, q_pos, seq_len), self._rotate_at(k, k_pos, seq_len)
        # RoPE's own rotation: cos/sin once when queries and keys share their positions
        # (self-attention), q and k rotated in one (compiled) call
        self._check_qk(q, k)
        q_cs = self.cos_sin(q_pos, seq_len)
        k_cs = q_cs if same_positions(q_pos, k_pos) else self.cos_sin(k_pos, seq_len)
        if self.rotary_channels == "last":
            return self._rotate_channels(q, *q_cs), self._rotate_channels(k, *k_cs)
        return rotate_pair(q, k, q_cs, k_cs, self.layout)

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
        return self._rotate_channels(x, cos, -sin if inverse else sin)

    def _rotate_channels(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """``rotate_pairs`` on the rotated channels of ``x``: its first ``r = 2 *
        cos.shape[-1]``, or with ``rotary_channels="last"`` its last ``r``."""
        keep = x.shape[-1] - 2 * cos.shape[-1]
        if self.rotary_channels == "first" or keep == 0:
            return rotate_pairs(x, cos, sin, self.layout)
        rotated = rotate_pairs(x[..., keep:], cos, sin, self.layout)
        return torch.cat((x[..., :keep], rotated), dim=-1)

    @classmethod
    def _rotates_through_rope(cls) -> bool:
        """Whether every rotation of the class goes through ``_rotate_at`` /
        ``_rotate_channels`` (it keeps RoPE's ``rotate_qk``, ``_rotate_at`` and piecewise
        and per-call hooks; an overridden ``rotate`` may call them, as RoVE's does)."""
        own = ("rotate_qk", "_rotate_at", "_rotate_channels", "pieces", "prepare_rotary")
        return all(getattr(cls, name) is getattr(RoPE, name) for name in own)

    def rotate(self, x: Tensor, pos: Tensor, role: str) -> Tensor:
        if role not in ("q", "k"):
            return x
        self._check_head_dim(x, role)
        if self.length_dependent:
            return self._rotate_at(x, pos, self.call_length((f"{role}_pos", pos)))
        return self._rotate_at(x, pos)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, base={self.base:g}, layout={self.layout!r}, "
            f"rotary_dim={self.rotary_dim}"
        )
