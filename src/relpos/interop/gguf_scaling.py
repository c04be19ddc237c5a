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
* ``ext_factor`` is ``{arch}.rope.scaling.yarn_ext_factor`` when the file sets it
  (``>= 0``; a negative one, ``llama_hparams``' default -1, is unset), else 1 for ``yarn``
  and 0 otherwise; with ``ext_factor != 0`` ``rope_yarn`` gives pair ``i`` the angle ``p
  (freq_scale theta_i (1 - m_i) + theta_i m_i)`` with ``m_i = ext_factor (1 - clamp((i -
  low) / max(0.001, high - low), 0, 1))``, ``low = max(0, floor(c(beta_fast)))``, ``high =
  min(n - 1, ceil(c(beta_slow)))``, ``c(b) = n ln(L0 / (2 pi b)) / (2 ln base)``, ``L0 =
  {arch}.rope.scaling.original_context_length`` (default ``{arch}.context_length``),
  ``beta_fast = 32``, ``beta_slow = 1`` unless ``{arch}.rope.scaling.yarn_beta_fast/slow``
  say otherwise; that is HF's ``"yarn"`` ramp over pair indices, the kept weight scaled by
  ``ext_factor`` (vLLM's ``extrapolation_factor``);
* the magnitude: cos and sin are multiplied by ``mscale``. With ``ext_factor != 0`` the
  context sets ``attn = get_mscale(s, m) / get_mscale(s, L) / (1 + 0.1 ln s) a``
  (``get_mscale(s, m) = 0.1 m ln s + 1``, 1 for ``s <= 1``; ``L =
  {arch}.rope.scaling.yarn_log_multiplier``, ``get_mscale(s, L)`` read as 1 when ``L = 0``;
  ``m = 1``, or ``L`` in ``deepseek2`` when ``L != 1``) and ``rope_yarn`` multiplies by ``1 +
  0.1 ln s``: ``mscale = get_mscale(s, m) / get_mscale(s, L) a``, with ``a =
  {arch}.rope.scaling.attn_factor`` (default 1); the file's ``yarn_attn_factor`` is replaced.
  Otherwise ``mscale = f a`` with ``f = {arch}.rope.scaling.yarn_attn_factor`` (default 1);
* the per-pair factors ``ff``: the tensor ``rope_freqs.weight`` when the file has one, else
  (Phi-3's LongRoPE) ``rope_factors_long.weight`` when llama.cpp's context per sequence
  ``n_ctx / n_seq_max`` exceeds ``L0`` and ``rope_factors_short.weight`` otherwise
  (``llama_model::get_rope_factors``): a choice made once per context, not per call;
* the base: ``{arch}.rope.freq_base``, times ``alpha^(d / (d - 2))`` for Hunyuan's
  ``{arch}.rope.scaling.alpha > 0`` (``gguf_rope_base``).

llama.cpp's loader reads ``yarn_ext_factor`` / ``yarn_attn_factor`` / ``yarn_beta_*`` /
``yarn_log_multiplier`` in the ``load_hparams`` of the architectures that use them (Grok's
reads the first four, DeepSeek-2's the last, among others); relpos reads them for every
architecture, as the context applies them once read (files llama.cpp writes for other
architectures carry the neutral values).

As relpos's ``rope`` ``scaling`` (``relpos.rope_scaling``):

* plain (``s = 1`` or ``ext_factor != 0`` without a factor, no factors, ``mscale = 1``):
  None;
* ``ext_factor = 0``, ``s > 1`` (no factors, ``mscale = 1``): ``{"rope_type": "linear",
  "factor": s}``;
* ``ext_factor = 0`` otherwise: ``{"rope_type": "freq_factors", "freq_factors": ff * s,
  "attention_factor": mscale}`` (``freq_scale`` folded into the factors);
* ``ext_factor != 0``, ``s > 1``, no factors: ``{"rope_type": "yarn", "factor": s,
  "original_max_position_embeddings": L0, "beta_fast", "beta_slow", "attention_factor":
  mscale}`` and ``"extrapolation_factor": ext_factor`` when it is not 1;
* ``ext_factor != 0`` with factors, ``s < 1`` or ``beta_fast < beta_slow`` (which relpos's
  ``yarn`` refuses): ``freq_factors`` with ``ff_i / ((1 - m_i) /
  s + m_i)`` (YaRN's blend as one more divisor per pair; ``m_i`` from the same helper as
  relpos's ``yarn``).

Refused by name (``ValueError``), where relpos would compute something else: a scaling type
llama.cpp does not know; the ``deepseek2`` graph whenever its softmax scale differs from
``1 / sqrt(d)`` (``src/models/deepseek2.cpp``: ``kq_scale = mscale^2 / sqrt(d)``, ``mscale
= attn (1 + 0.1 ln s) (1 + 0.1 L ln s)``, on every channel of the MLA head, not only the
rotated ones, while relpos's ``attention_factor`` scales the rotated channels); a
``scaling.alpha > 0`` on an architecture whose loader ignores it; sliding-window layers with
another base or rotary width (``freq_base_swa``, ``dimension_count_swa``: relpos builds one
rope for every layer, and ``load_gguf``'s ``LlamaLM`` has no sliding-window layers); an
empty YaRN correction range (``high < low``, where ggml's ramp and relpos's part ways);
LongRoPE factors without the context size they are chosen by.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..rope_scaling.methods import _yarn_keep_weight, _yarn_pair_index

__all__ = [
    "ALPHA_ARCHS",
    "FACTOR_TENSORS",
    "KQ_MSCALE_ARCHS",
    "LLAMA_CPP_SCALING_TYPES",
    "gguf_rope_base",
    "gguf_rope_scaling",
]

#: ``{arch}.rope.scaling.type`` values llama.cpp knows (``LLAMA_ROPE_SCALING_TYPES``)
LLAMA_CPP_SCALING_TYPES = ("none", "linear", "yarn", "longrope")

#: the tensors of per-pair frequency factors a GGUF file may hold
FACTOR_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")

#: the architectures whose loader scales the RoPE base by ``{arch}.rope.scaling.alpha``
#: (``src/models/hunyuan-vl.cpp``; ``hunyuan-dense`` derives from it)
ALPHA_ARCHS = ("hunyuan_vl", "hunyuan-dense")

#: the architectures whose graph multiplies the softmax scale by YaRN's mscale squared
#: (``src/models/deepseek2.cpp``: ``kq_scale = mscale * mscale / sqrt(n_embd_head_k)``)
KQ_MSCALE_ARCHS = ("deepseek2",)

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


def _arch(meta: Mapping[str, Any]) -> str:
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError("GGUF metadata lacks 'general.architecture'")
    return arch


def gguf_rope_base(meta: Mapping[str, Any]) -> float:
    """llama.cpp's ``rope_freq_base_train``: ``{arch}.rope.freq_base`` (default 1e4), times
    ``alpha^(d / (d - 2))`` for Hunyuan's ``{arch}.rope.scaling.alpha > 0`` (``d`` the key
    head size, ``{arch}.attention.key_length`` or ``embedding_length / head_count``).

    llama.cpp reads ``scaling.alpha`` for every architecture (``load_hparams``) but applies
    it only in ``llama_model_hunyuan_vl::load_arch_hparams`` (ggml-org/llama.cpp
    ``src/models/hunyuan-vl.cpp``; ``hunyuan-dense`` shares it): an ``alpha > 0`` on another
    architecture is refused (llama.cpp would rotate with the unscaled base, which the file
    does not mean); 0 or missing is no alpha.
    """
    arch = _arch(meta)
    base = _number(meta, f"{arch}.rope.freq_base")
    base = 10000.0 if base is None else base
    alpha = _number(meta, f"{arch}.rope.scaling.alpha")
    if alpha is None or alpha <= 0:
        return base
    if arch not in ALPHA_ARCHS:
        raise ValueError(
            f"GGUF {arch}.rope.scaling.alpha = {alpha:g}: llama.cpp applies it to the RoPE "
            f"base only for {list(ALPHA_ARCHS)} (src/models/hunyuan-vl.cpp) and rotates a "
            f"{arch!r} file with the unscaled base; relpos states neither against the file"
        )
    head_dim = meta.get(f"{arch}.attention.key_length")
    if head_dim is None:
        for key in ("embedding_length", "attention.head_count"):
            if f"{arch}.{key}" not in meta:
                raise ValueError(f"GGUF metadata lacks {arch}.{key!r}")
        head_dim = int(meta[f"{arch}.embedding_length"]) // int(
            meta[f"{arch}.attention.head_count"]
        )
    head_dim = int(head_dim)
    return base * alpha ** (head_dim / (head_dim - 2))


def _get_mscale(scale: float, mscale: float) -> float:
    """llama-context's ``get_mscale``: ``0.1 m ln s + 1`` (1 for ``s <= 1``)."""
    return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0


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
    arch = _arch(meta)

    def key(name: str) -> str:
        return f"{arch}.rope.{name}"

    kind = meta.get(key("scaling.type"), "linear")
    if kind not in LLAMA_CPP_SCALING_TYPES:
        raise ValueError(
            f"GGUF {key('scaling.type')!r} is {kind!r}; llama.cpp knows "
            f"{list(LLAMA_CPP_SCALING_TYPES)}"
        )
    base = gguf_rope_base(meta)
    file_base = _number(meta, key("freq_base"))
    swa_base = _number(meta, key("freq_base_swa"))
    if swa_base is not None and swa_base != (10000.0 if file_base is None else file_base):
        raise ValueError(
            f"GGUF {key('freq_base_swa')!r} = {swa_base:g}: llama.cpp rotates the "
            "sliding-window layers with another base than the others; relpos builds one rope "
            "for every layer (rope_convention returns one encoding; load_gguf's LlamaLM shares "
            "one encoding across its layers and has no sliding-window layers)"
        )
    swa_dim = meta.get(key("dimension_count_swa"))
    if swa_dim is not None and int(swa_dim) != rotary_dim:
        raise ValueError(
            f"GGUF {key('dimension_count_swa')!r} = {swa_dim}: the sliding-window layers "
            f"rotate another number of channels than the others ({rotary_dim}); relpos builds "
            "one rope for every layer"
        )

    factor = _number(meta, key("scaling.factor"))
    if factor is None:
        factor = _number(meta, key("scale_linear"))
    factor = 1.0 if not factor or kind == "none" else factor
    if factor <= 0:
        raise ValueError(f"GGUF {key('scaling.factor')!r} must be > 0, got {factor:g}")
    attn_factor = _number(meta, key("scaling.attn_factor"))
    attn_factor = 1.0 if attn_factor is None else attn_factor
    # llama_context: a negative ext_factor (llama_hparams' default -1) is "not set"
    ext_factor = _number(meta, key("scaling.yarn_ext_factor"))
    if ext_factor is None or ext_factor < 0:
        ext_factor = 1.0 if kind == "yarn" else 0.0
    yarn_attn = _number(meta, key("scaling.yarn_attn_factor"))
    yarn_attn = 1.0 if yarn_attn is None else yarn_attn
    log_mul = _number(meta, key("scaling.yarn_log_multiplier")) or 0.0
    original = meta.get(key("scaling.original_context_length")) or meta.get(
        f"{arch}.context_length"
    )

    # llama_context's yarn_attn_factor (cparams), then the magnitude ggml's rope_yarn gives
    # cos / sin: with ext_factor != 0 the context's 1 / (1 + 0.1 ln s) cancels rope_yarn's
    # 1 + 0.1 ln s, leaving get_mscale(s, m) / get_mscale(s, log_mul) * attn_factor
    if ext_factor != 0.0:
        # m = log_mul in deepseek2 ([TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]); get_mscale(s, 0) = 1
        # gives the context's branch without a log multiplier
        m = log_mul if (arch in KQ_MSCALE_ARCHS and log_mul not in (0.0, 1.0)) else 1.0
        ratio = _get_mscale(factor, m) / _get_mscale(factor, log_mul)
        context_attn = ratio / (1.0 + 0.1 * math.log(factor)) * attn_factor
        mscale = ratio * attn_factor
    else:
        context_attn = mscale = yarn_attn * attn_factor
    if arch in KQ_MSCALE_ARCHS:
        log_s = math.log(factor)
        kq_mscale = context_attn * (1.0 + 0.1 * log_s) * (1.0 + 0.1 * log_mul * log_s)
        if kq_mscale != 1.0:
            raise ValueError(
                f"llama.cpp's {arch} graph multiplies the softmax scale of every channel (the "
                f"MLA kq_scale, src/models/deepseek2.cpp) by mscale^2 = {kq_mscale**2:.6g}, "
                "mscale = yarn_attn_factor (1 + 0.1 ln s) (1 + 0.1 yarn_log_multiplier ln s), "
                "beyond the rotation; relpos's rope scales the rotated channels only"
            )
    if mscale <= 0:
        raise ValueError(
            f"GGUF RoPE magnitude {mscale:g} (scaling.attn_factor, yarn_attn_factor) must be > 0"
        )

    per_pair = _per_pair_factors(dict(factors or {}), rotary_dim // 2, original, context_length)
    if kind == "longrope" and per_pair is None:
        raise ValueError(
            f"GGUF {key('scaling.type')!r} is 'longrope' but the file holds no "
            "rope_factors_long / rope_factors_short tensors"
        )
    divisors = np.ones(rotary_dim // 2) if per_pair is None else per_pair
    if ext_factor != 0.0 and factor != 1.0:
        if original is None:
            raise ValueError(
                f"GGUF YaRN needs {key('scaling.original_context_length')!r} or "
                f"{arch}.context_length"
            )
        beta_fast = _number(meta, key("scaling.yarn_beta_fast"))
        beta_fast = YARN_BETA_FAST if beta_fast is None else beta_fast
        beta_slow = _number(meta, key("scaling.yarn_beta_slow"))
        beta_slow = YARN_BETA_SLOW if beta_slow is None else beta_slow
        if beta_fast <= 0 or beta_slow <= 0:
            raise ValueError(
                f"GGUF YaRN betas must be > 0 (ggml_rope_yarn_corr_dim divides by them), got "
                f"yarn_beta_fast={beta_fast:g}, yarn_beta_slow={beta_slow:g}"
            )
        low = max(0, math.floor(_yarn_pair_index(beta_fast, rotary_dim, base, int(original))))
        high = min(
            rotary_dim - 1, math.ceil(_yarn_pair_index(beta_slow, rotary_dim, base, int(original)))
        )
        if high < low:
            raise ValueError(
                f"GGUF YaRN correction range [{low}, {high}] is empty: ggml's rope_yarn_ramp "
                "divides by max(0.001, high - low), relpos's YaRN ramp by high - low"
            )
        if per_pair is None and factor > 1.0 and beta_fast >= beta_slow:
            scaling: dict[str, Any] = {
                "rope_type": "yarn",
                "factor": factor,
                "original_max_position_embeddings": int(original),
                "beta_fast": beta_fast,
                "beta_slow": beta_slow,
                "attention_factor": mscale,
            }
            if ext_factor != 1.0:
                scaling["extrapolation_factor"] = ext_factor
            return scaling
        # per-pair factors (or a frequency increase, or betas relpos's yarn refuses):
        # rope_yarn blends theta_i / ff_i, so the blend is one more divisor per pair,
        # 1 / ((1 - w_i) / s + w_i)
        keep = (
            _yarn_keep_weight(
                rotary_dim,
                base,
                int(original),
                beta_fast=beta_fast,
                beta_slow=beta_slow,
                extrapolation=ext_factor,
            )
            .double()
            .numpy()[: rotary_dim // 2]
        )
        divisors = divisors / ((1.0 - keep) / factor + keep)
    else:
        divisors = divisors * factor  # freq_scale folded into the divisors
    if per_pair is None and mscale == 1.0 and np.all(divisors == divisors[0]):
        if divisors[0] == 1.0:
            return None
        if ext_factor == 0.0 and divisors[0] > 1.0:
            return {"rope_type": "linear", "factor": float(divisors[0])}
    scaling = {"rope_type": "freq_factors", "freq_factors": [float(f) for f in divisors]}
    if mscale != 1.0:
        scaling["attention_factor"] = mscale
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
