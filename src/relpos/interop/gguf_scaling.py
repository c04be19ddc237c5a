"""llama.cpp's RoPE scaling, read from GGUF metadata, as a relpos ``scaling`` dict.

llama.cpp reads the scaling of a GGUF file into ``llama_hparams`` (ggml-org/llama.cpp
``src/llama-model.cpp``, ``load_hparams``), turns it into context parameters
(``src/llama-context.cpp``, the ``llama_context`` constructor) and rotates with
``ggml_rope_ext`` (``ggml/src/ggml-cpu/ops.cpp``: ``ggml_rope_cache_init``, ``rope_yarn``,
``rope_yarn_ramp``; ``ggml/src/ggml.c``: ``ggml_rope_yarn_corr_dims``). With ``n`` rotated
channels, pair ``i``'s base frequency ``theta_i = base^(-2i/n) / ff_i`` (``ff``: the per-pair
factors of the file, 1 without) and:

* ``freq_scale = 1 / s``, ``s = {arch}.rope.scaling.factor`` (or the older
  ``{arch}.rope.scale_linear``; 0 or missing: 1); ``{arch}.rope.scaling.type`` (``"none"``,
  ``"linear"``, ``"yarn"``, ``"longrope"``; missing: ``"linear"``); ``"none"`` forces
  ``freq_scale = 1``;
* ``ext_factor`` is 1 for ``yarn`` and 0 otherwise; ``rope_yarn`` gives pair ``i`` the angle
  ``p (freq_scale theta_i (1 - m_i) + theta_i m_i)`` with ``m_i = ext_factor (1 -
  clamp((i - low) / max(0.001, high - low), 0, 1))``, ``low = max(0, floor(c(beta_fast)))``,
  ``high = min(n - 1, ceil(c(beta_slow)))``, ``c(b) = n ln(L0 / (2 pi b)) / (2 ln base)``,
  ``L0 = {arch}.rope.scaling.original_context_length`` (default ``{arch}.context_length``),
  ``beta_fast = 32``, ``beta_slow = 1`` unless ``{arch}.rope.scaling.yarn_beta_fast/slow``
  say otherwise; that is HF's ``"yarn"`` ramp over pair indices;
* the magnitude: cos and sin are multiplied by ``mscale``. For ``yarn`` the context sets
  ``attn = (1 + 0.1 ln s) / (1 + 0.1 ln s) a`` (YaRN's ``get_mscale``, then the cancel of the
  factor ``rope_yarn`` applies again) and ``rope_yarn`` multiplies by ``1 + 0.1 ln s``:
  ``mscale = (1 + 0.1 ln s) a`` for ``s > 1``, with ``a = {arch}.rope.scaling.attn_factor``
  (default 1). Otherwise ``mscale = a``;
* the per-pair factors ``ff``: the tensor ``rope_freqs.weight`` when the file has one, else
  (Phi-3's LongRoPE) ``rope_factors_long.weight`` when llama.cpp's context per sequence
  ``n_ctx / n_seq_max`` exceeds ``L0`` and ``rope_factors_short.weight`` otherwise
  (``llama_model::get_rope_factors``): a choice made once per context, not per call.

As relpos's ``rope`` ``scaling`` (``relpos.rope_scaling``):

* plain (``s = 1``, no factors, ``a = 1``): None;
* ``linear`` with ``s != 1`` (no factors, ``a = 1``): ``{"rope_type": "linear", "factor": s}``;
* any non-YaRN type with per-pair factors or ``a != 1``: ``{"rope_type": "freq_factors",
  "freq_factors": ff * s, "attention_factor": a}`` (``freq_scale`` folded into the factors);
* ``yarn``: ``{"rope_type": "yarn", "factor": s, "original_max_position_embeddings": L0,
  "beta_fast", "beta_slow", "attention_factor": (1 + 0.1 ln s) a}``.

Refused by name (``ValueError``), where relpos would compute something else: YaRN together
with per-pair factors; a scaling type llama.cpp does not know; the keys llama.cpp reads only
for some architectures, whose graphs apply them their own way (``yarn_ext_factor`` other
than YaRN's 1, ``yarn_attn_factor`` other than 1, ``yarn_log_multiplier``: the MLA
architectures scale attention by YaRN's mscale themselves; ``scaling.alpha``); YaRN in
``deepseek2`` (its graph folds the mscale into the MLA score scale); sliding-window layers
with another base or rotary width (``freq_base_swa``, ``dimension_count_swa``); LongRoPE
factors without the context size they are chosen by.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["FACTOR_TENSORS", "LLAMA_CPP_SCALING_TYPES", "gguf_rope_scaling"]

#: ``{arch}.rope.scaling.type`` values llama.cpp knows (``LLAMA_ROPE_SCALING_TYPES``)
LLAMA_CPP_SCALING_TYPES = ("none", "linear", "yarn", "longrope")

#: the tensors of per-pair frequency factors a GGUF file may hold
FACTOR_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")

#: llama.cpp's defaults (``llama_hparams``: ``yarn_beta_fast``, ``yarn_beta_slow``)
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0


def _number(meta: Mapping[str, Any], key: str) -> float | None:
    value = meta.get(key)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"GGUF metadata {key!r} must be a number, got {value!r}") from None


def _factors(values: Any, name: str, pairs: int) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    if array.size != pairs or not np.all(np.isfinite(array)) or np.any(array <= 0):
        raise ValueError(
            f"the GGUF tensor {name!r} must hold {pairs} positive factors (one per rotary "
            f"pair), got {array.size} values"
        )
    return array


def gguf_rope_scaling(
    meta: Mapping[str, Any],
    *,
    rotary_dim: int,
    factors: Mapping[str, Any] | None = None,
    context_length: int | None = None,
) -> dict[str, Any] | None:
    """The relpos ``scaling`` dict of the file's RoPE scaling as llama.cpp computes it
    (module docstring), None for plain RoPE; ``ValueError`` naming what has no exact
    counterpart.

    Args:
        meta: the GGUF key/value metadata (``relpos.interop.gguf.read_metadata``).
        rotary_dim: the rotated channels ``n`` (``{arch}.rope.dimension_count``).
        factors: the file's per-pair factor tensors by name (``FACTOR_TENSORS``), if any.
        context_length: llama.cpp's context per sequence (``n_ctx / n_seq_max``); only
            LongRoPE factors read it, to choose the long or the short ones.
    """
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError("GGUF metadata lacks 'general.architecture'")

    def key(name: str) -> str:
        return f"{arch}.rope.{name}"

    kind = meta.get(key("scaling.type"), "linear")
    if kind not in LLAMA_CPP_SCALING_TYPES:
        raise ValueError(
            f"GGUF {key('scaling.type')!r} is {kind!r}; llama.cpp knows "
            f"{list(LLAMA_CPP_SCALING_TYPES)}"
        )
    for name, neutral in (("scaling.yarn_ext_factor", 1.0 if kind == "yarn" else 0.0),
                          ("scaling.yarn_attn_factor", 1.0)):  # fmt: skip
        value = _number(meta, key(name))
        if value is not None and value != neutral:
            raise ValueError(
                f"GGUF {key(name)!r} = {value:g}: llama.cpp reads it only for some "
                "architectures, whose graphs apply it their own way; relpos's rope does not "
                "state it"
            )
    for name in ("scaling.yarn_log_multiplier", "scaling.alpha"):
        if meta.get(key(name)) is not None:
            raise ValueError(
                f"GGUF {key(name)!r} is set: llama.cpp reads it only for some architectures "
                "(YaRN's mscale in the MLA attention of the DeepSeek-2 family; Hunyuan's NTK "
                "alpha), which change attention beyond the rotation; relpos's rope does not "
                "state it"
            )
    base = _number(meta, key("freq_base"))
    swa_base = _number(meta, key("freq_base_swa"))
    if swa_base is not None and swa_base != (10000.0 if base is None else base):
        raise ValueError(
            f"GGUF {key('freq_base_swa')!r} = {swa_base:g}: the sliding-window layers rotate "
            "with another base than the others; one relpos rope states one base"
        )
    swa_dim = meta.get(key("dimension_count_swa"))
    if swa_dim is not None and int(swa_dim) != rotary_dim:
        raise ValueError(
            f"GGUF {key('dimension_count_swa')!r} = {swa_dim}: the sliding-window layers "
            f"rotate another number of channels than the others ({rotary_dim})"
        )

    factor = _number(meta, key("scaling.factor"))
    if factor is None:
        factor = _number(meta, key("scale_linear"))
    factor = 1.0 if not factor or kind == "none" else factor
    if factor <= 0:
        raise ValueError(f"GGUF {key('scaling.factor')!r} must be > 0, got {factor:g}")
    attn_factor = _number(meta, key("scaling.attn_factor"))
    attn_factor = 1.0 if attn_factor is None else attn_factor
    original = meta.get(key("scaling.original_context_length")) or meta.get(
        f"{arch}.context_length"
    )

    per_pair = _per_pair_factors(dict(factors or {}), rotary_dim // 2, original, context_length)
    if kind == "longrope" and per_pair is None:
        raise ValueError(
            f"GGUF {key('scaling.type')!r} is 'longrope' but the file holds no "
            "rope_factors_long / rope_factors_short tensors"
        )
    if kind == "yarn":
        if per_pair is not None:
            raise ValueError(
                "the GGUF file asks for YaRN and holds per-pair frequency factors; llama.cpp "
                "divides the frequencies by them before YaRN's ramp, which relpos's yarn "
                "scaling does not state"
            )
        if arch == "deepseek2":
            raise ValueError(
                "YaRN in llama.cpp's deepseek2 graph: it folds YaRN's mscale into the MLA "
                "attention scale itself, which relpos's rope does not state"
            )
        if original is None:
            raise ValueError(
                f"GGUF YaRN needs {key('scaling.original_context_length')!r} or "
                f"{arch}.context_length"
            )
        if factor < 1:
            raise ValueError(
                f"GGUF YaRN factor {factor:g} < 1 (a frequency increase); relpos's yarn "
                "scaling extends the context (factor >= 1)"
            )
        beta_fast = _number(meta, key("scaling.yarn_beta_fast"))
        beta_slow = _number(meta, key("scaling.yarn_beta_slow"))
        mscale = 1.0 + 0.1 * math.log(factor) if factor > 1 else 1.0
        return {
            "rope_type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": int(original),
            "beta_fast": YARN_BETA_FAST if beta_fast is None else beta_fast,
            "beta_slow": YARN_BETA_SLOW if beta_slow is None else beta_slow,
            "attention_factor": mscale * attn_factor,
        }
    if per_pair is None and attn_factor == 1.0:
        return None if factor == 1.0 else {"rope_type": "linear", "factor": factor}
    if attn_factor <= 0:
        raise ValueError(f"GGUF {key('scaling.attn_factor')!r} must be > 0, got {attn_factor:g}")
    divisors = np.ones(rotary_dim // 2) if per_pair is None else per_pair
    scaling: dict[str, Any] = {
        "rope_type": "freq_factors",
        "freq_factors": [float(f) * factor for f in divisors],
    }
    if attn_factor != 1.0:
        scaling["attention_factor"] = attn_factor
    return scaling


def _per_pair_factors(
    factors: dict[str, Any], pairs: int, original: Any, context_length: int | None
) -> np.ndarray | None:
    """The per-pair factors llama.cpp divides the frequencies by (``get_rope_factors``)."""
    unknown = sorted(set(factors) - set(FACTOR_TENSORS))
    if unknown:
        raise ValueError(f"unknown per-pair factor tensors {unknown}; known: {FACTOR_TENSORS}")
    freqs = factors.get("rope_freqs.weight")
    if freqs is not None:
        return _factors(freqs, "rope_freqs.weight", pairs)
    long, short = factors.get("rope_factors_long.weight"), factors.get("rope_factors_short.weight")
    if long is None and short is None:
        return None
    if long is None or short is None:
        raise ValueError(
            "the GGUF file holds only one of rope_factors_long / rope_factors_short; "
            "llama.cpp's LongRoPE needs both"
        )
    if context_length is None:
        raise ValueError(
            "the GGUF file holds LongRoPE factors (rope_factors_long / rope_factors_short); "
            "llama.cpp picks the long ones when its context per sequence exceeds the original "
            "context length and the short ones otherwise, so pass context_length (llama.cpp's "
            "n_ctx / n_seq_max)"
        )
    if original is None:
        raise ValueError("LongRoPE factors need the original context length of the file")
    chosen = (
        "rope_factors_long.weight"
        if context_length > int(original)
        else ("rope_factors_short.weight")
    )
    return _factors(factors[chosen], chosen, pairs)
