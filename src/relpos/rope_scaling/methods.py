"""RoPE frequency scaling: context-extension methods as pure functions of one signature.

Every scaling type is a function with one signature, held by its ``ScalingType`` record in
``ROPE_SCALING``::

    fn(dim, base, params, *, seq_len, max_position_embeddings, head_dim)
        -> (inv_freq, attention_factor)

``dim = int(head_dim * partial_rotary_factor)`` is the number of rotated channels (GPT-NeoX
convention); ``params`` is a Hugging Face ``rope_scaling`` / ``rope_parameters`` dict
checked by ``validate_scaling``; ``inv_freq`` is float32 of shape ``(ceil(dim / 2),)``
(``head_dim // 2`` for ``proportional``), computed with the same float32 arithmetic as
``transformers`` 5.x so HF checkpoints match bit for bit. ``attention_factor`` multiplies
**both** cos and sin (HF semantics), so the logits are scaled by its square.

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

Sources: HF ``transformers`` ``modeling_rope_utils.py`` (the ``_compute_*_parameters``
functions; reference values from transformers 5.24.0 are pinned in
tests/rope_scaling/test_methods.py), jquesnelle/yarn (NTK-aware, YaRN), meta-llama/llama-models
(Llama 3), microsoft/LongRoPE.

Length dependence and the KV cache
----------------------------------
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
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from .scaling_type import ScalingType, check_number, is_number

__all__ = [
    "ROPE_SCALING",
    "default",
    "linear",
    "ntk",
    "dynamic",
    "yarn",
    "llama3",
    "longrope",
    "proportional",
    "ntk_scaled_base",
]


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
    ``factor``. E.g. factor 4, dim 64, base 1e4 -> 41829.366.
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
    Attention factor 1. As HF ``_compute_linear_scaling_rope_parameters``.
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
    Not an HF type (HF only has the dynamic form). Attention factor 1. As jquesnelle/yarn.
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
    the default RoPE. Attention factor 1. As HF ``_compute_dynamic_ntk_parameters``.
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


def _yarn_keep_weight(
    dim: int,
    base: float,
    original: int,
    *,
    beta_fast: float,
    beta_slow: float,
    truncate: bool = True,
    extrapolation: float = 1.0,
) -> Tensor:
    """YaRN's per-pair weight of the original frequency, float32 of shape ``(ceil(dim/2),)``:
    ``(1 - ramp_i) * extrapolation`` with ``ramp_i = clamp((i - low) / (high - low), 0, 1)``,
    ``low = corr(beta_fast)``, ``high = corr(beta_slow)`` (``_yarn_pair_index``; floor / ceil
    with ``truncate``), clamped to ``[0, dim - 1]``, ``high + 0.001`` when they meet (HF's and
    vLLM's ``yarn_linear_ramp_mask``). ``extrapolation`` is vLLM's ``extrapolation_factor``
    (``deepseek_yarn``; earlier vLLM's ``yarn``) and llama.cpp's ``ext_factor``."""
    low = _yarn_pair_index(beta_fast, dim, base, original)
    high = _yarn_pair_index(beta_slow, dim, base, original)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid 0 / 0 in the ramp
    pairs = (dim + 1) // 2
    ramp = ((torch.arange(pairs, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp
    return keep if extrapolation == 1.0 else keep * extrapolation


def _yarn_blend(dim: int, base: float, factor: float, keep_weight: Tensor) -> Tensor:
    """``theta_i / s * (1 - w_i) + theta_i * w_i`` in float32 (HF's and vLLM's order)."""
    powers = base ** _exponents(dim)  # 1 / theta_i
    keep = 1.0 / powers  # extrapolation: the original frequency
    interpolated = 1.0 / (factor * powers)  # position interpolation by s
    return interpolated * (1 - keep_weight) + keep * keep_weight


#: the magnitude keys of earlier vLLM's ``yarn`` (``YaRNScalingRotaryEmbedding``:
#: ``attn_factor``, ``apply_yarn_scaling``) and those of transformers' (and vLLM 0.34.0's)
#: ``yarn``: no stack reads both, so a dict may carry one family only
_VLLM_YARN_MAGNITUDE = ("attn_factor", "apply_yarn_scaling")
_HF_YARN_MAGNITUDE = ("attention_factor", "mscale", "mscale_all_dim")


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

    ``factor`` missing or ``None`` means ``max_position_embeddings / L0``. As HF
    ``_compute_yarn_parameters``.

    Earlier vLLM's ``"yarn"`` keys (vllm-project/vllm,
    ``vllm/model_executor/layers/rotary_embedding/yarn_scaling_rope.py``,
    ``YaRNScalingRotaryEmbedding``, before 0.34.0), which transformers does not read:
    ``extrapolation_factor`` ``e`` (default 1) multiplies the kept weight ``1 - ramp_i``;
    ``attn_factor`` ``a`` (default 1) and ``apply_yarn_scaling`` (default True) give the
    magnitude ``(0.1 ln s + 1) a``, or ``a`` when ``apply_yarn_scaling`` is False. They
    replace transformers' magnitude keys (``attention_factor``, ``mscale``,
    ``mscale_all_dim``): a dict with both is refused.
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
    if any(params.get(k) is not None for k in _VLLM_YARN_MAGNITUDE):
        scaled = params.get("apply_yarn_scaling", True)
        attention_factor = (_yarn_mscale(factor) if scaled else 1.0) * params.get(
            "attn_factor", 1.0
        )
    elif attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)

    keep_weight = _yarn_keep_weight(
        dim,
        base,
        original,
        beta_fast=params.get("beta_fast") or 32,
        beta_slow=params.get("beta_slow") or 1,
        truncate=params.get("truncate", True),
        extrapolation=params.get("extrapolation_factor", 1.0),
    )
    return _yarn_blend(dim, base, factor, keep_weight), float(attention_factor)


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
    Attention factor 1. As HF ``_compute_llama3_parameters``.
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
    unless ``attention_factor`` is given. As HF ``_compute_longrope_parameters``.
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
    rotary) and sets the remaining ``head_dim // 2 - r`` to 0, so cos/sin cover the
    whole head and the zero-frequency pairs are identity ("NoPE") channels. Then
    ``theta /= factor`` (default 1). Returns ``head_dim // 2`` frequencies. As HF
    ``_compute_proportional_rope_parameters``.
    """
    kept = dim // 2
    theta = 1.0 / (base ** (torch.arange(0, 2 * kept, 2, dtype=torch.int64).float() / head_dim))
    zeros = torch.zeros(head_dim // 2 - kept, dtype=torch.float32)
    return torch.cat((theta, zeros)) / (params.get("factor") or 1.0), 1.0


# --------------------------------------------------------------------------- range checks


def _check_factor(params: Mapping[str, Any], rope_type: str, **_: Any) -> None:
    """A context-extension ``factor`` is ``>= 1`` and an ``attention_factor`` ``> 0``."""
    check_number(params, "factor", rope_type, minimum=1.0)
    check_number(params, "attention_factor", rope_type, minimum=0.0, strict=True)


def _check_yarn(params: Mapping[str, Any], rope_type: str, **_: Any) -> None:
    _check_factor(params, rope_type)
    check_number(params, "beta_fast", rope_type, minimum=0.0, strict=True)
    check_number(params, "beta_slow", rope_type, minimum=0.0, strict=True)
    check_number(params, "mscale", rope_type, minimum=0.0)
    check_number(params, "mscale_all_dim", rope_type, minimum=0.0)
    check_number(params, "attn_factor", rope_type, minimum=0.0, strict=True)
    check_number(params, "extrapolation_factor", rope_type, minimum=0.0)
    beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1
    if beta_fast < beta_slow:
        raise ValueError(
            f"rope scaling 'yarn': 'beta_fast' ({beta_fast}) must be >= 'beta_slow' ({beta_slow})"
        )
    for key in ("truncate", "apply_yarn_scaling"):
        if key in params and not isinstance(params[key], bool):
            raise ValueError(
                f"rope scaling {rope_type!r}: {key!r} must be True or False, got {params[key]!r}"
            )


def _check_yarn_magnitude(params: Mapping[str, Any], rope_type: str, **kwargs: Any) -> None:
    """``yarn``'s checks, and one family of magnitude keys (``yarn``'s docstring)."""
    _check_yarn(params, rope_type, **kwargs)
    vllm = [k for k in _VLLM_YARN_MAGNITUDE if params.get(k) is not None]
    hf = [k for k in _HF_YARN_MAGNITUDE if params.get(k) is not None]
    if vllm and hf:
        raise ValueError(
            f"rope scaling {rope_type!r}: {vllm} (earlier vLLM's YaRN magnitude) and {hf} "
            "(transformers' and vLLM 0.34's) each set the magnitude, and no stack reads both; "
            "give one family"
        )


def _check_llama3(params: Mapping[str, Any], rope_type: str, **_: Any) -> None:
    _check_factor(params, rope_type)
    check_number(params, "low_freq_factor", rope_type, minimum=0.0, strict=True)
    check_number(params, "high_freq_factor", rope_type, minimum=0.0, strict=True)
    if not params["high_freq_factor"] > params["low_freq_factor"]:
        raise ValueError(
            f"rope scaling 'llama3': 'high_freq_factor' ({params['high_freq_factor']}) must "
            f"be > 'low_freq_factor' ({params['low_freq_factor']})"
        )


def _check_longrope(
    params: Mapping[str, Any],
    rope_type: str,
    *,
    head_dim: int | None = None,
    partial_rotary_factor: float = 1.0,
) -> None:
    """Factor lists of positive numbers, one per frequency ``ceil(dim / 2)`` (when
    ``head_dim`` is known), ``dim = int(head_dim * partial_rotary_factor)``."""
    _check_factor(params, rope_type)
    dim = None if head_dim is None else int(head_dim * partial_rotary_factor)
    for key in ("short_factor", "long_factor"):
        value = params[key]
        if not (isinstance(value, list) and value and all(is_number(x) and x > 0 for x in value)):
            raise ValueError(
                f"rope scaling 'longrope': {key!r} must be a list of positive numbers, got "
                f"{value!r}"
            )
        if dim is not None and len(value) != (dim + 1) // 2:
            raise ValueError(
                f"rope scaling 'longrope': {key!r} must have one entry per frequency, "
                f"(dim + 1) // 2 = {(dim + 1) // 2} for dim = int(head_dim * "
                f"partial_rotary_factor) = {dim}, got {len(value)}"
            )


def _check_proportional(params: Mapping[str, Any], rope_type: str, **_: Any) -> None:
    """p-RoPE's ``factor`` divides the kept frequencies: any positive number."""
    check_number(params, "factor", rope_type, minimum=0.0, strict=True)


# --------------------------------------------------------------------------- the table

_YARN_KEYS = {
    "factor",
    "original_max_position_embeddings",
    "attention_factor",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "truncate",
    # earlier vLLM's (``yarn`` documents them)
    "extrapolation_factor",
    "attn_factor",
    "apply_yarn_scaling",
}

#: every scaling type, one record each (``relpos.rope_scaling.ScalingType``)
ROPE_SCALING: dict[str, ScalingType] = {
    "default": ScalingType(default),
    "linear": ScalingType(linear, required=frozenset({"factor"}), check=_check_factor),
    "ntk": ScalingType(ntk, required=frozenset({"factor"}), check=_check_factor),
    "dynamic": ScalingType(
        dynamic, required=frozenset({"factor"}), length_dependent=True, check=_check_factor
    ),
    "yarn": ScalingType(
        yarn,
        optional=frozenset(_YARN_KEYS),
        needs_original=True,
        check=_check_yarn_magnitude,
    ),
    "llama3": ScalingType(
        llama3,
        required=frozenset({"factor", "low_freq_factor", "high_freq_factor"}),
        optional=frozenset({"original_max_position_embeddings"}),
        needs_original=True,
        check=_check_llama3,
    ),
    "longrope": ScalingType(
        longrope,
        required=frozenset({"short_factor", "long_factor"}),
        optional=frozenset({"original_max_position_embeddings", "factor", "attention_factor"}),
        length_dependent=True,
        needs_original=True,
        check=_check_longrope,
    ),
    "proportional": ScalingType(
        proportional, optional=frozenset({"factor"}), check=_check_proportional
    ),
}
