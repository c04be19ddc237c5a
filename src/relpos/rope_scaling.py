"""RoPE frequency scaling: context-extension methods as pure functions of one signature.

Every scaling type is a function with one signature, registered in ``ROPE_SCALING``::

    fn(dim, base, params, *, seq_len, max_position_embeddings, head_dim)
        -> (inv_freq, attention_factor)

``dim = int(head_dim * partial_rotary_factor)`` is the number of rotated channels (GPT-NeoX
convention, spec P4a); ``params`` is a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict
checked by ``validate_scaling``; ``inv_freq`` is float32 of shape ``(ceil(dim / 2),)``
(``head_dim // 2`` for ``proportional``), computed with the same float32 arithmetic as
``transformers`` 5.x so HF checkpoints match bit for bit. ``attention_factor`` multiplies
**both** cos and sin (HF semantics, spec P5), so the logits are scaled by its square.

Types (``theta_i = base^(-2i/d)``):

* ``default``: RoPE (Su et al. 2021), unchanged.
* ``linear``: position interpolation (Chen et al. 2023), ``theta_i / factor``.
* ``ntk``: static NTK-aware (bloc97), base ``b * factor^(d/(d-2))``; not an HF type.
* ``dynamic``: dynamic NTK (emozilla), the NTK base for ``factor * L / L_max - (factor - 1)``.
* ``yarn``: YaRN (Peng et al. 2023), per-pair ramp between ``theta_i`` and ``theta_i / factor``
  plus an attention factor.
* ``llama3``: Llama 3.1 (Meta), wavelength bands kept / smoothed / divided by ``factor``.
* ``longrope``: LongRoPE (Ding et al. 2024, Phi-3), ``theta_i / lambda_i`` with short or long
  ``lambda``.
* ``proportional``: p-RoPE (Barbero et al. 2024, Gemma 4), keep the first ``p * head_dim / 2``
  pairs with head_dim-based frequencies, zero the rest.

Formulas, defaults and reference values: ``../shared/spec/formulas-rotary.md`` sections 3-9, 14
and R.2-R.6, R.9.

Length dependence and the KV cache (spec P3)
--------------------------------------------
``dynamic`` and ``longrope`` depend on ``seq_len`` (the largest position + 1 of the call):
dynamic NTK recomputes the base from it, LongRoPE switches from ``short_factor`` to
``long_factor`` once it exceeds ``original_max_position_embeddings``. Keys cached *after*
rotation would then carry an older base than the query that reads them (HF does exactly
this). ``is_length_dependent(scaling)`` tells an encoding that it must not cache rotated keys:
it should cache raw keys and re-rotate the whole cache with the frequencies of the current
length, so queries and keys of one call always share one base. Note that HF's runtime keeps
the dynamic-NTK frequencies of the longest sequence seen so far (it only recomputes on growth
and resets below the original length); here the frequencies are a pure function of
``seq_len``. All other types ignore ``seq_len``.

Differences from ``transformers`` (all on inputs HF accepts with a warning or crashes on):

* validation raises ``ValueError`` where HF only logs a warning (unknown keys, ``factor < 1``,
  ``beta_fast < beta_slow``, wrong-length LongRoPE factors, ...);
* ``yarn`` accepts a missing ``factor`` key (HF requires the key, value may be ``None``);
* ``truncate`` must be a bool (HF treats an explicit ``None`` as ``False``);
* for an odd rotated ``dim`` (partial rotary) the YaRN ramp and the LongRoPE factor lengths use
  the ``ceil(dim / 2)`` frequencies actually produced (HF uses ``dim // 2`` and fails to
  broadcast);
* ``proportional`` accepts an optional ``factor`` (HF reads it but its validator warns).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "ROPE_SCALING",
    "LENGTH_DEPENDENT",
    "RopeScalingFn",
    "default",
    "linear",
    "ntk",
    "dynamic",
    "yarn",
    "llama3",
    "longrope",
    "proportional",
    "ntk_scaled_base",
    "validate_scaling",
    "is_length_dependent",
]

RopeScalingFn = Callable[..., tuple[Tensor, float]]

# Keys every type accepts besides its own: the type itself (``rope_type`` or legacy ``type``)
# and the two model-level values HF v5 moves into ``rope_parameters``.
_COMMON_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})

# Types whose inverse frequencies change with the sequence length (see the module docstring).
LENGTH_DEPENDENT = frozenset({"dynamic", "longrope"})

# Types that read ``original_max_position_embeddings`` (filled from max_position_embeddings).
_NEEDS_ORIGINAL = frozenset({"yarn", "llama3", "longrope"})


# --------------------------------------------------------------------------- helpers


def _exponents(dim: int) -> Tensor:
    """``2i / dim`` for ``i = 0 .. ceil(dim/2) - 1`` in float32 (HF's exact arithmetic)."""
    return torch.arange(0, dim, 2, dtype=torch.int64).float() / dim


def _plain_inv_freq(dim: int, base: float) -> Tensor:
    """``base ** (-2i / dim)`` as ``1 / base ** (2i / dim)`` in float32, as HF computes it."""
    return 1.0 / (base ** _exponents(dim))


def _original_length(params: Mapping, max_position_embeddings: int | None, rope_type: str) -> int:
    """``original_max_position_embeddings``, filled from ``max_position_embeddings`` as HF does."""
    original = params.get("original_max_position_embeddings")
    if original is None:
        original = max_position_embeddings
    if original is None:
        raise ValueError(
            f"rope scaling {rope_type!r} needs the pretraining length: give "
            f"'original_max_position_embeddings' in the scaling dict or max_position_embeddings"
        )
    return original


def ntk_scaled_base(base: float, factor: float, dim: int) -> float:
    """NTK-aware base (bloc97): ``base * factor ** (dim / (dim - 2))``.

    The highest frequency (i = 0) is unchanged and the lowest is divided by exactly
    ``factor``. Spec §4: factor 4, dim 64, base 1e4 -> 41829.366.
    """
    if dim <= 2:
        raise ValueError(
            f"NTK scaling needs more than 2 rotated channels (head_dim * partial_rotary_factor), "
            f"got {dim}"
        )
    return base * factor ** (dim / (dim - 2))


# --------------------------------------------------------------------------- the types


def default(
    dim: int,
    base: float,
    params: Mapping,
    *,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    head_dim: int | None = None,
) -> tuple[Tensor, float]:
    """RoPE (Su et al. 2021): ``theta_i = base^(-2i/dim)``; attention factor 1."""
    return _plain_inv_freq(dim, base), 1.0


def linear(
    dim: int,
    base: float,
    params: Mapping,
    *,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    head_dim: int | None = None,
) -> tuple[Tensor, float]:
    """Position interpolation (Chen et al. 2023, arXiv 2306.15595) = HF ``"linear"``.

    Positions ``p -> p / s`` are the same as ``theta_i -> theta_i / s`` with ``s = factor``.
    Attention factor 1. Spec §3, R.2.
    """
    return _plain_inv_freq(dim, base) / params["factor"], 1.0


def ntk(
    dim: int,
    base: float,
    params: Mapping,
    *,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    head_dim: int | None = None,
) -> tuple[Tensor, float]:
    """Static NTK-aware scaling (bloc97; jquesnelle/yarn): a larger base, positions unchanged.

    ``b' = b * alpha^(d / (d - 2))`` with ``alpha = factor``; ``theta_i = b'^(-2i/d)``.
    Not an HF type (HF only has the dynamic form). Attention factor 1. Spec §4.
    """
    return _plain_inv_freq(dim, ntk_scaled_base(base, params["factor"], dim)), 1.0


def dynamic(
    dim: int,
    base: float,
    params: Mapping,
    *,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    head_dim: int | None = None,
) -> tuple[Tensor, float]:
    """Dynamic NTK (emozilla 2023) = HF ``"dynamic"``; depends on ``seq_len``.

    ``L = max(seq_len, L_max)`` with ``L_max = max_position_embeddings`` (the *original*
    length) and ``seq_len`` defaulting to ``L_max``; then the NTK base
    ``b' = b * (factor * L / L_max - (factor - 1))^(d / (d - 2))``. At ``L <= L_max`` this is
    the default RoPE. Attention factor 1. Spec §5, R.3.
    """
    if max_position_embeddings is None:
        raise ValueError(
            "rope scaling 'dynamic' needs max_position_embeddings (the pretraining length)"
        )
    reference = max_position_embeddings
    length = reference if seq_len is None else max(seq_len, reference)
    factor = params["factor"]
    alpha = (factor * length / reference) - (factor - 1)
    return _plain_inv_freq(dim, ntk_scaled_base(base, alpha, dim)), 1.0


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction ``0.1 * mscale * ln(s) + 1`` (1 for ``s <= 1``)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _yarn_pair_index(rotations: float, dim: int, base: float, original: int) -> float:
    """Pair index whose wavelength fits ``rotations`` full turns into ``original`` positions."""
    return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))


def yarn(
    dim: int,
    base: float,
    params: Mapping,
    *,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    head_dim: int | None = None,
) -> tuple[Tensor, float]:
    """YaRN (Peng et al. 2023, arXiv 2309.00071) = HF ``"yarn"`` (v5 semantics).

    With ``s = factor``, ``L0 = original_max_position_embeddings``:

    * pair indices ``low = floor(corr(beta_fast))``, ``high = ceil(corr(beta_slow))`` with
      ``corr(r) = d ln(L0 / (2 pi r)) / (2 ln b)`` (no floor/ceil when ``truncate`` is False),
      clamped to ``[0, d - 1]``;
    * ``ramp_i = clamp((i - low) / (high - low), 0, 1)``: ``theta_i`` is kept below ``low``
      (high frequencies), divided by ``s`` above ``high``, blended linearly in between;
    * ``attention_factor = 0.1 ln s + 1`` (or ``(0.1 mscale ln s + 1) / (0.1 mscale_all_dim
      ln s + 1)`` when both are given, DeepSeek), unless given explicitly.

    ``factor`` missing or ``None`` means ``max_position_embeddings / L0``. Spec §6, R.4.
    """
    original = _original_length(params, max_position_embeddings, "yarn")
    factor = params.get("factor")
    if factor is None:
        if max_position_embeddings is None:
            raise ValueError(
                "rope scaling 'yarn' without 'factor' needs max_position_embeddings "
                "(factor = max_position_embeddings / original_max_position_embeddings)"
            )
        factor = max_position_embeddings / original

    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)

    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1
    low = _yarn_pair_index(beta_fast, dim, base, original)
    high = _yarn_pair_index(beta_slow, dim, base, original)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid 0 / 0 in the ramp

    powers = base ** _exponents(dim)  # 1 / theta_i
    keep = 1.0 / powers  # extrapolation: the original frequency
    interpolated = 1.0 / (factor * powers)  # position interpolation by s
    ramp = ((torch.arange(powers.numel(), dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep_weight = 1 - ramp
    return interpolated * (1 - keep_weight) + keep * keep_weight, float(attention_factor)


def llama3(
    dim: int,
    base: float,
    params: Mapping,
    *,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    head_dim: int | None = None,
) -> tuple[Tensor, float]:
    """Llama 3.1 scaling (Meta, ``apply_scaling``) = HF ``"llama3"``.

    With wavelength ``lambda_i = 2 pi / theta_i``, ``L0 = original_max_position_embeddings``:
    ``lambda_i < L0 / high_freq_factor`` keeps ``theta_i``; ``lambda_i > L0 / low_freq_factor``
    uses ``theta_i / factor``; in between (bounds inclusive)
    ``theta_i' = (1 - s) theta_i / factor + s theta_i`` with
    ``s = (L0 / lambda_i - low_freq_factor) / (high_freq_factor - low_freq_factor)``.
    Attention factor 1. Spec §7, R.5.
    """
    original = _original_length(params, max_position_embeddings, "llama3")
    factor = params["factor"]
    low_ff, high_ff = params["low_freq_factor"], params["high_freq_factor"]
    theta = _plain_inv_freq(dim, base)
    wavelength = 2 * math.pi / theta
    kept_below = original / high_ff  # shorter wavelengths (high frequencies): unchanged
    scaled_above = original / low_ff  # longer wavelengths (low frequencies): / factor
    scaled = torch.where(wavelength > scaled_above, theta / factor, theta)
    smooth = (original / wavelength - low_ff) / (high_ff - low_ff)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= kept_below) & (wavelength <= scaled_above)
    return torch.where(medium, blended, scaled), 1.0


def longrope(
    dim: int,
    base: float,
    params: Mapping,
    *,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    head_dim: int | None = None,
) -> tuple[Tensor, float]:
    """LongRoPE (Ding et al. 2024, arXiv 2402.13753) = HF ``"longrope"``; depends on ``seq_len``.

    ``theta_i = 1 / (lambda_i * b^(2i/d))`` with ``lambda = long_factor`` when
    ``seq_len > L0 = original_max_position_embeddings``, else ``short_factor`` (also when
    ``seq_len`` is None). ``attention_factor = sqrt(1 + ln s / ln L0)`` (1 if ``s <= 1``) with
    ``s = factor``, or ``max_position_embeddings / L0`` when ``factor`` is not given (Phi-3),
    unless ``attention_factor`` is given. Spec §8, R.6.
    """
    original = _original_length(params, max_position_embeddings, "longrope")
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        factor = params.get("factor")
        if factor is None:
            if max_position_embeddings is None:
                raise ValueError(
                    "rope scaling 'longrope' without 'factor' or 'attention_factor' needs "
                    "max_position_embeddings (factor = max_position_embeddings / "
                    "original_max_position_embeddings)"
                )
            factor = max_position_embeddings / original
        if factor <= 1.0:
            attention_factor = 1.0
        else:
            attention_factor = math.sqrt(1 + math.log(factor) / math.log(original))
    use_long = seq_len is not None and seq_len > original
    lam = torch.tensor(params["long_factor" if use_long else "short_factor"], dtype=torch.float32)
    return 1.0 / (lam * base ** _exponents(dim)), float(attention_factor)


def proportional(
    dim: int,
    base: float,
    params: Mapping,
    *,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    head_dim: int,
) -> tuple[Tensor, float]:
    """p-RoPE (Barbero et al. 2024, arXiv 2410.06205) = HF ``"proportional"`` (Gemma 4).

    Keeps the ``r = int(p * head_dim // 2) = dim // 2`` highest frequencies
    ``theta_i = b^(-2i / head_dim)`` (exponent over **head_dim**, not ``2r``: unlike partial
    rotary, spec P4b) and sets the remaining ``head_dim // 2 - r`` to 0, so cos/sin cover the
    whole head and the zero-frequency pairs are identity ("NoPE") channels. Then
    ``theta /= factor`` (default 1). Returns ``head_dim // 2`` frequencies. Spec §14, R.9.
    """
    kept = dim // 2
    theta = 1.0 / (base ** (torch.arange(0, 2 * kept, 2, dtype=torch.int64).float() / head_dim))
    zeros = torch.zeros(head_dim // 2 - kept, dtype=torch.float32)
    return torch.cat((theta, zeros)) / (params.get("factor") or 1.0), 1.0


ROPE_SCALING: dict[str, RopeScalingFn] = {
    "default": default,
    "linear": linear,
    "ntk": ntk,
    "dynamic": dynamic,
    "yarn": yarn,
    "llama3": llama3,
    "longrope": longrope,
    "proportional": proportional,
}


# --------------------------------------------------------------------------- validation

# Per type: (required keys, optional keys), besides _COMMON_KEYS.
_KEYS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "default": (frozenset(), frozenset()),
    "linear": (frozenset({"factor"}), frozenset()),
    "ntk": (frozenset({"factor"}), frozenset()),
    "dynamic": (frozenset({"factor"}), frozenset()),
    "yarn": (
        frozenset(),
        frozenset(
            {
                "factor",
                "original_max_position_embeddings",
                "attention_factor",
                "beta_fast",
                "beta_slow",
                "mscale",
                "mscale_all_dim",
                "truncate",
            }
        ),
    ),
    "llama3": (
        frozenset({"factor", "low_freq_factor", "high_freq_factor"}),
        frozenset({"original_max_position_embeddings"}),
    ),
    "longrope": (
        frozenset({"short_factor", "long_factor"}),
        frozenset({"original_max_position_embeddings", "factor", "attention_factor"}),
    ),
    "proportional": (frozenset(), frozenset({"factor"})),
}
assert set(_KEYS) == set(ROPE_SCALING)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_number(
    params: Mapping, key: str, rope_type: str, *, minimum: float, strict: bool = False
) -> None:
    """``params[key]`` (when present and not None) is a finite number ``>= minimum``."""
    value = params.get(key)
    if value is None:
        return
    ok = _is_number(value) and (value > minimum if strict else value >= minimum)
    if not ok:
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise ValueError(
            f"rope scaling {rope_type!r}: {key!r} must be a number {bound}, got {value!r}"
        )


def _resolve_type(scaling: Mapping) -> str:
    """The scaling type from ``rope_type`` or the legacy ``type`` key (default: ``default``)."""
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
    rope_type = _resolve_type(scaling)
    required, optional = _KEYS[rope_type]
    received = set(scaling)
    allowed = required | optional | _COMMON_KEYS
    expected = f"required {sorted(required)}, optional {sorted(optional | _COMMON_KEYS - {'type'})}"
    unknown = received - allowed
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
    if theta is not None and not (_is_number(theta) and theta > 1):
        raise ValueError(
            f"rope scaling {rope_type!r}: 'rope_theta' must be a number > 1, got {theta!r}"
        )
    prf = params.get("partial_rotary_factor")
    if prf is not None:
        low_ok = prf >= 0 if rope_type == "proportional" else prf > 0
        if not (_is_number(prf) and low_ok and prf <= 1):
            interval = "[0, 1]" if rope_type == "proportional" else "(0, 1]"
            raise ValueError(
                f"rope scaling {rope_type!r}: 'partial_rotary_factor' must be in {interval}, "
                f"got {prf!r}"
            )

    # Type-specific ranges.
    if rope_type == "proportional":
        _check_number(params, "factor", rope_type, minimum=0.0, strict=True)
    elif rope_type != "default":
        _check_number(params, "factor", rope_type, minimum=1.0)
    _check_number(params, "attention_factor", rope_type, minimum=0.0, strict=True)
    if rope_type == "yarn":
        _check_number(params, "beta_fast", rope_type, minimum=0.0, strict=True)
        _check_number(params, "beta_slow", rope_type, minimum=0.0, strict=True)
        _check_number(params, "mscale", rope_type, minimum=0.0)
        _check_number(params, "mscale_all_dim", rope_type, minimum=0.0)
        beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1
        if beta_fast < beta_slow:
            raise ValueError(
                f"rope scaling 'yarn': 'beta_fast' ({beta_fast}) must be >= 'beta_slow' "
                f"({beta_slow})"
            )
        if "truncate" in params and not isinstance(params["truncate"], bool):
            raise ValueError(
                f"rope scaling 'yarn': 'truncate' must be True or False, got {params['truncate']!r}"
            )
    if rope_type == "llama3":
        _check_number(params, "low_freq_factor", rope_type, minimum=0.0, strict=True)
        _check_number(params, "high_freq_factor", rope_type, minimum=0.0, strict=True)
        if not params["high_freq_factor"] > params["low_freq_factor"]:
            raise ValueError(
                f"rope scaling 'llama3': 'high_freq_factor' ({params['high_freq_factor']}) must "
                f"be > 'low_freq_factor' ({params['low_freq_factor']})"
            )
    if rope_type == "longrope":
        if prf is None:
            prf = 1.0 if partial_rotary_factor is None else partial_rotary_factor
        dim = None if head_dim is None else int(head_dim * prf)
        for key in ("short_factor", "long_factor"):
            value = params[key]
            if not (
                isinstance(value, list) and value and all(_is_number(x) and x > 0 for x in value)
            ):
                raise ValueError(
                    f"rope scaling 'longrope': {key!r} must be a list of positive numbers, got "
                    f"{scaling[key]!r}"
                )
            if dim is not None and len(value) != (dim + 1) // 2:
                raise ValueError(
                    f"rope scaling 'longrope': {key!r} must have one entry per frequency, "
                    f"(dim + 1) // 2 = {(dim + 1) // 2} for dim = int(head_dim * "
                    f"partial_rotary_factor) = {dim}, got {len(value)}"
                )

    if rope_type in _NEEDS_ORIGINAL:
        original = params.get("original_max_position_embeddings")
        if original is None:
            if max_position_embeddings is None:
                raise ValueError(
                    f"rope scaling {rope_type!r} needs the pretraining length: give "
                    f"'original_max_position_embeddings' in the scaling dict or "
                    f"max_position_embeddings"
                )
            params["original_max_position_embeddings"] = max_position_embeddings
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
    return _resolve_type(scaling) in LENGTH_DEPENDENT
