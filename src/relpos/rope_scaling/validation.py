"""Validation of RoPE scaling dicts (Hugging Face ``rope_scaling`` / ``rope_parameters``).

``validate_scaling`` accepts an HF dict verbatim (``rope_type`` or the legacy ``type`` key;
``rope_theta`` and ``partial_rotary_factor`` allowed inside), rejects unknown or missing keys
and out-of-range values with a ``ValueError`` that names the type, the key and the expected
keys, and returns a normalised copy for the functions in ``relpos.rope_scaling``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .methods import ROPE_SCALING
from .scaling_type import COMMON_KEYS, is_number

__all__ = ["LENGTH_DEPENDENT", "is_length_dependent", "resolve_type", "validate_scaling"]

#: the types whose frequencies depend on the sequence length (``dynamic``, ``longrope``)
LENGTH_DEPENDENT = frozenset(name for name, t in ROPE_SCALING.items() if t.length_dependent)


#: ``(type, key): type``: a dict of the first type that carries the key is the second type.
#: Hunyuan checkpoints write NTK by a fixed ``alpha`` as ``"dynamic"`` (transformers'
#: ``HunYuanDenseV1RotaryEmbedding`` and vLLM's ``get_rope`` both read it as ``ntk_alpha``).
SELECTED_BY_KEY = {("dynamic", "alpha"): "ntk_alpha"}


def resolve_type(scaling: Mapping) -> str:
    """The scaling type from ``rope_type`` or the legacy ``type`` key (default: ``default``),
    after ``SELECTED_BY_KEY``."""
    rope_type = scaling.get("rope_type")
    legacy = scaling.get("type")
    if rope_type is not None and legacy is not None and rope_type != legacy:
        raise ValueError(
            f"rope scaling has both 'rope_type'={rope_type!r} and legacy 'type'={legacy!r}; "
            f"they must agree"
        )
    rope_type = rope_type if rope_type is not None else legacy
    if rope_type is None:
        rope_type = "default"
    for (name, key), selected in SELECTED_BY_KEY.items():
        if rope_type == name and scaling.get(key) is not None:
            rope_type = selected
    if rope_type not in ROPE_SCALING:
        raise ValueError(
            f"unknown rope scaling type {rope_type!r}; known types: {sorted(ROPE_SCALING)}"
        )
    return rope_type


def validate_scaling(
    scaling: Mapping[str, Any] | None,
    *,
    head_dim: int | None = None,
    max_position_embeddings: int | None = None,
    partial_rotary_factor: float | None = None,
    require_original: bool = True,
) -> dict[str, Any]:
    """Check an HF ``rope_scaling`` / ``rope_parameters`` dict and return a normalized copy.

    The dict is taken verbatim: the type may be under ``rope_type`` or the legacy ``type`` key,
    and ``rope_theta`` / ``partial_rotary_factor`` may appear inside it (they override the
    model-level values). Unknown keys, missing required keys, an unknown type, or a value out
    of range raise ``ValueError`` naming the type, the offending keys and the expected ones.

    Args:
        scaling: the dict, or None for the default RoPE.
        head_dim: when given, LongRoPE factor lists are checked against the number of
            frequencies ``ceil(dim / 2)``, ``dim = int(head_dim * partial_rotary_factor)``.
        max_position_embeddings: the model-config length. ``original_max_position_embeddings``
            is filled from it for ``yarn`` / ``llama3`` / ``longrope`` when missing (as HF does).
        partial_rotary_factor: the model-level value, used when the dict has none.
        require_original: with False, a missing ``original_max_position_embeddings`` (and no
            ``max_position_embeddings``) is left to the caller (an option check that cannot
            see the model length).

    Returns:
        a new dict with ``rope_type`` set, the legacy ``type`` key dropped, list values copied,
        and ``original_max_position_embeddings`` filled where the type reads it.
    """
    if scaling is None:
        return {"rope_type": "default"}
    if not isinstance(scaling, Mapping):
        raise TypeError(
            f"scaling must be a dict (an HF rope_scaling / rope_parameters) or None, "
            f"got {scaling!r}"
        )
    rope_type = resolve_type(scaling)
    record = ROPE_SCALING[rope_type]
    required, optional = record.required, record.optional
    received = set(scaling)
    expected = f"required {sorted(required)}, optional {sorted(optional | COMMON_KEYS - {'type'})}"
    unknown = received - record.allowed
    if unknown:
        raise ValueError(
            f"rope scaling {rope_type!r} has unknown keys {sorted(unknown)}; expected keys: "
            f"{expected}"
        )
    missing = required - received
    if missing:
        raise ValueError(
            f"rope scaling {rope_type!r} is missing required keys {sorted(missing)}; expected "
            f"keys: {expected}"
        )
    for key in sorted(required):
        if scaling[key] is None:
            raise ValueError(f"rope scaling {rope_type!r}: {key!r} must not be None")

    params = {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in scaling.items()}
    params.pop("type", None)
    params["rope_type"] = rope_type

    # Model-level values that may live inside the dict.
    theta = params.get("rope_theta")
    if theta is not None and not (is_number(theta) and theta > 1):
        raise ValueError(
            f"rope scaling {rope_type!r}: 'rope_theta' must be a number > 1, got {theta!r}"
        )
    prf = params.get("partial_rotary_factor")
    if prf is not None:
        low_ok = prf >= 0 if rope_type == "proportional" else prf > 0
        if not (is_number(prf) and low_ok and prf <= 1):
            interval = "[0, 1]" if rope_type == "proportional" else "(0, 1]"
            raise ValueError(
                f"rope scaling {rope_type!r}: 'partial_rotary_factor' must be in {interval}, "
                f"got {prf!r}"
            )

    if prf is None:
        prf = 1.0 if partial_rotary_factor is None else partial_rotary_factor
    record.check(params, rope_type, head_dim=head_dim, partial_rotary_factor=prf)

    if record.needs_original:
        original = params.get("original_max_position_embeddings")
        if original is None:
            if max_position_embeddings is not None:
                params["original_max_position_embeddings"] = max_position_embeddings
            elif require_original:
                raise ValueError(
                    f"rope scaling {rope_type!r} needs the pretraining length: give "
                    f"'original_max_position_embeddings' in the scaling dict or "
                    f"max_position_embeddings"
                )
        elif isinstance(original, bool) or not isinstance(original, int) or original <= 0:
            raise ValueError(
                f"rope scaling {rope_type!r}: 'original_max_position_embeddings' must be a "
                f"positive int, got {original!r}"
            )
    return params


def is_length_dependent(scaling: Mapping[str, Any] | None) -> bool:
    """True when the scaling's frequencies depend on ``seq_len`` (``dynamic``, ``longrope``).

    An encoding with such a scaling must not cache rotated keys (``cache_rotated_keys =
    False``): it caches raw keys and re-rotates them with the current length's frequencies.
    """
    if scaling is None:
        return False
    if not isinstance(scaling, Mapping):
        raise TypeError(
            f"scaling must be a dict (an HF rope_scaling / rope_parameters) or None, "
            f"got {scaling!r}"
        )
    return ROPE_SCALING[resolve_type(scaling)].length_dependent
