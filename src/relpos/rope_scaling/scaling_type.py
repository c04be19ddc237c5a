"""One RoPE scaling type as a record (the shape of HF ``modeling_rope_utils``).

``ScalingType(compute, required, optional, length_dependent, needs_original, check)`` holds
everything relpos knows about a type: the frequency function, the keys its dict must and may
carry, whether its frequencies follow the call's length, whether it reads
``original_max_position_embeddings``, and its own range checks. ``relpos.rope_scaling.methods``
defines one record per type in ``ROPE_SCALING``; ``relpos.rope_scaling.validation`` reads
only these records.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

__all__ = [
    "COMMON_KEYS",
    "RopeScalingFn",
    "ScalingCheck",
    "ScalingType",
    "check_number",
    "is_number",
]

#: ``fn(dim, base, params, *, seq_len, max_position_embeddings, head_dim)
#: -> (inv_freq, attention_factor)``
RopeScalingFn = Callable[..., tuple[Tensor, float]]

#: ``check(params, rope_type, *, head_dim, partial_rotary_factor)``: raises ``ValueError``
ScalingCheck = Callable[..., None]

#: Keys every type accepts besides its own: the type itself (``rope_type`` or legacy
#: ``type``) and the two model-level values HF v5 moves into ``rope_parameters``.
COMMON_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})


def _no_check(params: Mapping[str, Any], rope_type: str, **_: Any) -> None:
    """The check of types without constraints beyond their keys."""


@dataclass(frozen=True)
class ScalingType:
    """Everything about one RoPE scaling type.

    Attributes:
        compute: ``fn(dim, base, params, *, seq_len, max_position_embeddings, head_dim)
            -> (inv_freq, attention_factor)``; calling the record calls it.
        required / optional: the keys of its dict besides ``COMMON_KEYS``.
        length_dependent: its frequencies depend on ``seq_len`` (an encoding must then cache
            raw keys and re-rotate them).
        needs_original: it reads ``original_max_position_embeddings`` (filled from
            ``max_position_embeddings`` when missing, as HF does).
        check: ``check(params, rope_type, *, head_dim, partial_rotary_factor)`` raises
            ``ValueError`` for values out of range (``head_dim`` may be None).
    """

    compute: RopeScalingFn
    required: frozenset[str] = frozenset()
    optional: frozenset[str] = frozenset()
    length_dependent: bool = False
    needs_original: bool = False
    check: ScalingCheck = _no_check

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[Tensor, float]:
        return self.compute(*args, **kwargs)

    @property
    def allowed(self) -> frozenset[str]:
        """Every key a dict of this type may carry."""
        return self.required | self.optional | COMMON_KEYS


def is_number(value: object) -> bool:
    """A finite int or float (never a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_number(
    params: Mapping[str, Any], key: str, rope_type: str, *, minimum: float, strict: bool = False
) -> None:
    """``params[key]`` (when present and not None) is a finite number ``>= minimum``
    (``> minimum`` with ``strict``); else ``ValueError`` naming the type and the key."""
    value = params.get(key)
    if value is None:
        return
    ok = is_number(value) and (value > minimum if strict else value >= minimum)
    if not ok:
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise ValueError(
            f"rope scaling {rope_type!r}: {key!r} must be a number {bound}, got {value!r}"
        )
