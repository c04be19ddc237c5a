"""Pure functions shared by every encoding: frequencies, rotations, slopes, buckets.

Nothing here holds state; encodings and backends compose these. Each function states its
paper and the exact formula it implements.
"""

from __future__ import annotations

import math
import warnings
from functools import cache

import torch
from torch import Tensor

from .validation import check_bool, check_float, check_int

__all__ = [
    "rope_frequencies",
    "rope_angles",
    "apply_rotary",
    "apply_rotary_fused",
    "alibi_slopes",
    "t5_bucket",
    "sinusoidal_table",
]


def rope_frequencies(
    head_dim: int,
    base: float = 10000.0,
    scaling: dict | None = None,
    *,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    partial_rotary_factor: float = 1.0,
) -> tuple[Tensor, float]:
    """Inverse frequencies of RoPE (Su et al. 2021, RoFormer) and the attention factor.

    ``theta_i = base ** (-2i / d)`` for ``i = 0 .. d/2 - 1`` where ``d = int(head_dim *
    partial_rotary_factor)`` (GPT-NeoX convention: the frequency range is spread over the
    rotated channels only). Computed in float32 exactly as Hugging Face ``transformers``
    (``1 / base ** (arange(0, d, 2).float() / d)``) so checkpoints trained there match bit for bit.
    A ``scaling`` dict selects a context-extension type from ``relpos.rope_scaling.ROPE_SCALING``
    (``linear``, ``ntk``, ``dynamic``, ``yarn``, ``llama3``, ``longrope``, ``proportional``);
    see that module for the formulas and for the length-dependent types and the KV cache.

    Args:
        head_dim: channels per head.
        base: the RoPE base ("rope_theta"); ``rope_theta`` inside ``scaling`` overrides it.
        scaling: an HF ``rope_scaling`` / ``rope_parameters`` dict, verbatim (``rope_type`` or
            legacy ``type``); unknown keys, missing keys or types raise ``ValueError``.
            ``None`` is the default RoPE.
        seq_len: current sequence length (largest position + 1); read by ``dynamic`` and
            ``longrope`` only.
        max_position_embeddings: the model-config length HF reads besides the dict: dynamic
            NTK's reference length, YaRN's factor when the dict has none, LongRoPE's attention
            factor, and the fallback for a missing ``original_max_position_embeddings``.
        partial_rotary_factor: fraction of ``head_dim`` that is rotated, in (0, 1]; a value
            inside ``scaling`` overrides it. For ``proportional`` (p-RoPE) it is the fraction
            of frequencies kept, in [0, 1], and cos/sin still cover the whole head.

    Returns:
        ``(inv_freq, attention_factor)``: ``inv_freq`` has shape ``(ceil(d / 2),)`` float32
        (``(head_dim // 2,)`` for ``proportional``); ``attention_factor`` multiplies cos and
        sin (HF semantics), 1.0 except for ``yarn`` and ``longrope``.
    """
    from . import rope_scaling  # the scaling types live there; it imports nothing from here

    check_int(head_dim, "head_dim")
    base = check_float(base, "base", above=1.0)
    for name, value in (("seq_len", seq_len), ("max_position_embeddings", max_position_embeddings)):
        if value is not None:
            check_int(value, name)
    params = rope_scaling.validate_scaling(
        scaling,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        partial_rotary_factor=partial_rotary_factor,
    )
    rope_type = params["rope_type"]
    base = params.get("rope_theta", base)
    partial_rotary_factor = params.get("partial_rotary_factor", partial_rotary_factor)
    proportional = rope_type == "proportional"
    partial_rotary_factor = check_float(
        partial_rotary_factor,
        "partial_rotary_factor",
        minimum=0.0 if proportional else None,
        above=None if proportional else 0.0,
        maximum=1.0,
    )
    dim = int(head_dim * partial_rotary_factor)
    if proportional:
        if head_dim % 2:
            raise ValueError(
                f"head_dim must be even for proportional RoPE (cos/sin span the head), got "
                f"{head_dim}"
            )
    elif dim < 2:
        raise ValueError(
            f"head_dim * partial_rotary_factor must leave at least 2 rotated channels, got {dim}"
        )
    if partial_rotary_factor == 1.0 and head_dim % 2:
        raise ValueError(f"head_dim must be even for full rotary, got {head_dim}")
    return rope_scaling.ROPE_SCALING[rope_type].compute(
        dim,
        base,
        params,
        seq_len=seq_len,
        max_position_embeddings=max_position_embeddings,
        head_dim=head_dim,
    )


EXACT_ANGLE_LIMIT = 2**16  # integer positions up to here: float32 angles, as HF forms them


def rope_angles(pos: Tensor, inv_freq: Tensor) -> Tensor:
    """Angles ``pos * theta`` as float32, accurate to float32 rounding of an angle in [0, 2 pi).

    The product is formed in float64 (exact for float32 frequencies and integer positions up
    to 2^29). Per element: integer positions up to ``EXACT_ANGLE_LIMIT`` (2^16) are cast to
    float32 directly, which is bit-identical to HF's ``pos.float() * inv_freq``; everything
    else (larger or fractional positions) is first reduced modulo 2 pi in float64, so the
    angle error stays below ``2^-24 * 2 pi`` instead of growing with the position (a float32
    angle is off by up to 0.03 rad at p = 10^6 and 0.44 rad at p = 2^24). The choice is made
    per element, so a token's rotation never depends on the other positions of the call (the
    KV cache and the full forward agree).

    Shapes: ``pos (..., L)`` int or float, ``inv_freq (F,)`` -> ``(..., L, F)`` float32.
    """
    ang = pos.to(torch.float64)[..., None] * inv_freq.to(torch.float64)
    if not pos.is_floating_point() and (
        pos.numel() == 0 or int(pos.abs().max()) <= EXACT_ANGLE_LIMIT
    ):
        # every position is small: the per-element rule below picks ``ang`` everywhere
        # (one reduction instead of a float64 remainder and select over every angle)
        return ang.to(torch.float32)
    reduced = torch.remainder(ang, 2 * math.pi)
    if pos.is_floating_point():
        return reduced.to(torch.float32)
    small = (pos.abs() <= EXACT_ANGLE_LIMIT)[..., None]
    return torch.where(small, ang, reduced).to(torch.float32)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "half") -> Tensor:
    """Rotate channel pairs of ``x`` by the angles whose cos/sin are given.

    Pair ``(a, b)`` becomes ``(a cos - b sin, a sin + b cos)``.

    * ``layout="half"`` (GPT-NeoX / HF Llama): pairs are ``(x_i, x_{i + r/2})``.
    * ``layout="interleaved"`` (RoFormer, GPT-J, Meta Llama): pairs are ``(x_{2i}, x_{2i+1})``.

    Shapes: ``x (..., L, D)``; ``cos, sin (..., L, r/2)`` broadcastable to x's leading dims, with
    ``r = 2 * cos.shape[-1] <= D``. Channels ``r..D`` pass through unchanged (partial rotary).
    The arithmetic runs in ``x.dtype`` (cos/sin are cast), as in HF.
    """
    if layout not in ("half", "interleaved"):
        raise ValueError(f"layout must be 'half' or 'interleaved', got {layout!r}")
    r = 2 * cos.shape[-1]
    if r > x.shape[-1]:
        raise ValueError(
            f"x has {x.shape[-1]} channels but cos/sin rotate {r}; expected cos.shape[-1] <= D/2"
        )
    cos = cos.to(x.dtype)
    sin = sin.to(x.dtype)
    rot, rest = (x, None) if r == x.shape[-1] else (x[..., :r], x[..., r:])
    if layout == "half":
        x1, x2 = rot[..., : r // 2], rot[..., r // 2 :]
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return out if rest is None else torch.cat((out, rest), dim=-1)


@cache
def _compiled_rotary():
    return torch.compile(apply_rotary, fullgraph=True)


_FUSED_BROKEN = False


def apply_rotary_fused(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "half") -> Tensor:
    """``apply_rotary`` compiled into one kernel (``torch.compile``), same result.

    The eager form makes several passes over ``x``; compiled, the half-split rotation runs at
    the speed of a copy (docs/benchmarks.md). Falls back to eager, once with a warning, if
    compilation is unavailable. Inside an outer ``torch.compile`` the eager form is traced.
    """
    global _FUSED_BROKEN
    if _FUSED_BROKEN or torch.compiler.is_compiling():
        return apply_rotary(x, cos, sin, layout)
    try:
        return _compiled_rotary()(x, cos, sin, layout)
    except Exception as err:  # noqa: BLE001 - any compiler failure means: stay eager
        _FUSED_BROKEN = True
        warnings.warn(f"relpos: fused rotary unavailable ({err}); using eager", stacklevel=2)
        return apply_rotary(x, cos, sin, layout)


def apply_rotary_pair(
    q: Tensor,
    k: Tensor,
    cos_q: Tensor,
    sin_q: Tensor,
    cos_k: Tensor,
    sin_k: Tensor,
    layout: str = "half",
) -> tuple[Tensor, Tensor]:
    """``apply_rotary`` of queries and keys, each with its own ``cos``/``sin`` (pass the same
    tensors twice when the positions are the same)."""
    return apply_rotary(q, cos_q, sin_q, layout), apply_rotary(k, cos_k, sin_k, layout)


@cache
def _compiled_rotary_pair():
    return torch.compile(apply_rotary_pair, fullgraph=True)


def apply_rotary_pair_fused(
    q: Tensor,
    k: Tensor,
    cos_q: Tensor,
    sin_q: Tensor,
    cos_k: Tensor,
    sin_k: Tensor,
    layout: str = "half",
) -> tuple[Tensor, Tensor]:
    """``apply_rotary_pair`` compiled into one graph (one kernel launch for q and k, the
    shared cos/sin read once per tile), same result; falls back like ``apply_rotary_fused``."""
    global _FUSED_BROKEN
    if _FUSED_BROKEN or torch.compiler.is_compiling():
        return apply_rotary_pair(q, k, cos_q, sin_q, cos_k, sin_k, layout)
    try:
        return _compiled_rotary_pair()(q, k, cos_q, sin_q, cos_k, sin_k, layout)
    except Exception as err:  # noqa: BLE001 - any compiler failure means: stay eager
        _FUSED_BROKEN = True
        warnings.warn(f"relpos: fused rotary unavailable ({err}); using eager", stacklevel=2)
        return apply_rotary_pair(q, k, cos_q, sin_q, cos_k, sin_k, layout)


def alibi_slopes(num_heads: int) -> Tensor:
    """ALiBi head slopes (Press et al. 2021, official ``get_slopes``), float32, shape ``(H,)``.

    For ``H`` a power of two, ``m_h = 2 ** (-8 (h + 1) / H)``. Otherwise, with
    ``c = 2 ** floor(log2 H)``: the ``c`` slopes for ``c`` heads, then the even-indexed entries
    (``0, 2, 4, ...``) of the slopes for ``2c`` heads, ``H - c`` of them. Not sorted for such H.
    """
    check_int(num_heads, "num_heads")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (k + 1) for k in range(n)]

    closest = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = power_of_two(closest)
    if closest != num_heads:
        slopes += power_of_two(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)


def t5_bucket(
    relative_position: Tensor,
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Tensor:
    """T5 relative-position bucket (Raffel et al. 2020; HF ``_relative_position_bucket``).

    ``relative_position = key_pos - query_pos``. Bidirectional: half the buckets for each sign
    (future keys in the upper half). Causal: future keys fall in bucket 0. Within a side,
    distances below ``nb // 2`` get their own bucket; larger ones are log-spaced up to
    ``max_distance``, beyond which they share the last bucket. Returns int64, same shape.

    The geometry needs at least one exact bucket per side and a log range after it:
    ``nb // 2 >= 1`` (``num_buckets >= 4`` bidirectional, ``>= 2`` causal) and
    ``max_distance > nb // 2``; other values raise ``ValueError`` naming the argument.
    """
    check_bool(bidirectional, "bidirectional")
    check_int(num_buckets, "num_buckets", minimum=2)
    check_int(max_distance, "max_distance")
    if not isinstance(relative_position, Tensor) or relative_position.is_floating_point():
        raise TypeError("relative_position must be an integer tensor")
    nb = num_buckets // 2 if bidirectional else num_buckets
    max_exact = nb // 2
    if max_exact < 1:
        raise ValueError(
            f"num_buckets must be >= 4 for bidirectional buckets (half per side, one exact "
            f"bucket each), got {num_buckets}"
        )
    if max_distance <= max_exact:
        raise ValueError(
            f"max_distance must be > {max_exact} (the exact buckets of num_buckets="
            f"{num_buckets}{', bidirectional' if bidirectional else ''}), got {max_distance}"
        )
    rp = relative_position.to(torch.int64)
    ret = torch.zeros_like(rp)
    if bidirectional:
        ret = ret + (rp > 0).to(torch.int64) * nb
        n = rp.abs()
    else:
        n = (-rp).clamp(min=0)
    is_small = n < max_exact
    # log(0) is masked out by the `where`; clamp keeps it finite so no NaN warnings appear.
    n_f = n.clamp(min=1).to(torch.float32)
    large = max_exact + (
        torch.log(n_f / max_exact) / math.log(max_distance / max_exact) * (nb - max_exact)
    ).to(torch.int64)
    large = large.clamp(max=nb - 1)
    return ret + torch.where(is_small, n, large)


def sinusoidal_table(pos: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """Absolute sinusoidal embedding (Vaswani et al. 2017), float32, ``(..., L, dim)``.

    ``PE[p, 2i] = sin(p / base^(2i/dim))``, ``PE[p, 2i+1] = cos(p / base^(2i/dim))``.
    Angles are formed in float64 for fractional or very large positions (see ``rope_angles``).
    ``base`` must be a finite number > 1 and ``dim`` a positive even int.
    """
    check_int(dim, "dim")
    if dim % 2:
        raise ValueError(f"dim must be even for the sinusoidal table, got {dim}")
    base = check_float(base, "base", above=1.0)
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    ang = rope_angles(pos, inv_freq)
    return torch.stack((ang.sin(), ang.cos()), dim=-1).flatten(-2)
