"""YaRN as DeepSeek's code and vLLM's ``deepseek_yarn`` define it (not transformers' ``yarn``).

vLLM (``vllm/model_executor/layers/rotary_embedding/deepseek_scaling_rope.py``,
``DeepseekScalingRotaryEmbedding``; selected by ``rope_type`` ``"deepseek_yarn"`` or
``"deepseek_llama_scaling"`` in ``__init__.py``'s ``get_rope``) differs from transformers'
``yarn`` in its magnitude and one extra knob:

* ``attention_factor = mscale(s, mscale) / mscale(s, mscale_all_dim) * attn_factor`` with
  ``mscale(s, m) = 0.1 m ln s + 1`` (1 for ``s <= 1``) and the defaults ``mscale = 1``,
  ``mscale_all_dim = 0``, ``attn_factor = 1``. transformers uses the ratio only when both
  ``mscale`` and ``mscale_all_dim`` are non-zero and ``0.1 ln s + 1`` otherwise, so a dict
  with ``mscale`` alone gives different magnitudes in the two stacks;
* ``extrapolation_factor`` (default 1) multiplies the extrapolation weight
  ``1 - ramp_i`` of every pair;
* the correction range is always truncated (``floor`` / ``ceil``); there is no
  ``truncate`` key.

The frequencies are otherwise YaRN's (Peng et al. 2023, "YaRN: Efficient Context Window
Extension of Large Language Models", arXiv 2309.00071): pair indices
``low = floor(corr(beta_fast))``, ``high = ceil(corr(beta_slow))``,
``corr(r) = d ln(L0 / (2 pi r)) / (2 ln b)``, clamped to ``[0, d - 1]``,
``ramp_i = clamp((i - low) / (high - low), 0, 1)`` and
``theta_i' = theta_i / s * (1 - w_i) + theta_i * w_i`` with ``w_i = (1 - ramp_i) *
extrapolation_factor``. DeepSeek-V3 also multiplies its softmax scale by
``mscale(s, mscale_all_dim)^2``; that is the model's attention, not its RoPE.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from .methods import (
    _check_yarn,
    _original_length,
    _yarn_blend,
    _yarn_keep_weight,
    _yarn_mscale,
)
from .scaling_type import ScalingType

__all__ = ["YARN_VARIANTS", "deepseek_yarn"]


def deepseek_yarn(
    dim: int,
    base: float,
    params: Mapping,
    *,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    head_dim: int | None = None,
) -> tuple[Tensor, float]:
    """vLLM's ``deepseek_yarn`` (module docstring): float32 frequencies in vLLM's order of
    operations, the attention factor as a Python float."""
    original = _original_length(params, max_position_embeddings, "deepseek_yarn")
    factor = params["factor"]
    mscale = float(params.get("mscale", 1.0))
    mscale_all_dim = float(params.get("mscale_all_dim", 0.0))
    attn_factor = params.get("attn_factor", 1.0)
    extrapolation = params.get("extrapolation_factor", 1.0)
    attention_factor = (
        _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim) * attn_factor
    )
    keep_weight = _yarn_keep_weight(
        dim,
        base,
        original,
        beta_fast=params.get("beta_fast", 32),
        beta_slow=params.get("beta_slow", 1),
        extrapolation=extrapolation,
    )
    return _yarn_blend(dim, base, factor, keep_weight), float(attention_factor)


_DEEPSEEK_YARN = ScalingType(
    deepseek_yarn,
    required=frozenset({"factor"}),
    optional=frozenset(
        {
            "original_max_position_embeddings",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "attn_factor",
            "extrapolation_factor",
        }
    ),
    needs_original=True,
    check=_check_yarn,
)

#: the records this module adds to ``ROPE_SCALING`` (vLLM's two names for one class)
YARN_VARIANTS: dict[str, ScalingType] = {
    "deepseek_yarn": _DEEPSEEK_YARN,
    "deepseek_llama_scaling": _DEEPSEEK_YARN,
}
