"""Per-pair frequency divisors: llama.cpp's ``rope_freqs`` tensor.

llama.cpp stores Llama-3.1-style scaling (and other per-pair schemes) in a GGUF file as a
float32 tensor ``rope_freqs.weight`` of one factor per rotary pair; ``ggml_rope_ext`` divides
each pair's angle by it (``ggml/src/ggml-cpu/ops.cpp``, ``ggml_rope_cache_init``:
``theta / freq_factors[i0 / 2]``). As a scaling dict::

    {"rope_type": "freq_factors", "freq_factors": [f_0, ..., f_{d/2 - 1}],
     "attention_factor": a}

gives ``theta_i = base^(-2i/d) / f_i`` (float32) and cos / sin multiplied by ``a`` (optional,
default 1: llama.cpp's ``{arch}.rope.scaling.attn_factor``, which ``ggml_rope_ext`` applies as
``mscale`` outside YaRN, e.g. Phi-3's LongRoPE factor). Static.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from .methods import _exponents
from .scaling_type import ScalingType, check_number, is_number

__all__ = ["FREQUENCY_FACTORS", "freq_factors"]


def freq_factors(
    dim: int,
    base: float,
    params: Mapping,
    *,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    head_dim: int | None = None,
) -> tuple[Tensor, float]:
    """``theta_i = 1 / (f_i * base^(2i/d))`` with ``f = params["freq_factors"]``; attention
    factor ``params["attention_factor"]`` (default 1)."""
    factors = torch.tensor(params["freq_factors"], dtype=torch.float32)
    if factors.numel() != (dim + 1) // 2:
        raise ValueError(
            f"rope scaling 'freq_factors': one factor per rotary pair, (dim + 1) // 2 = "
            f"{(dim + 1) // 2} for {dim} rotated channels, got {factors.numel()}"
        )
    attention_factor = params.get("attention_factor")
    return 1.0 / (factors * base ** _exponents(dim)), float(
        1.0 if attention_factor is None else attention_factor
    )


def _check(
    params: Mapping[str, Any],
    rope_type: str,
    *,
    head_dim: int | None = None,
    partial_rotary_factor: float = 1.0,
) -> None:
    check_number(params, "attention_factor", rope_type, minimum=0.0, strict=True)
    value = params["freq_factors"]
    if not (isinstance(value, list) and value and all(is_number(x) and x > 0 for x in value)):
        raise ValueError(
            f"rope scaling {rope_type!r}: 'freq_factors' must be a list of positive numbers, "
            f"got {value!r}"
        )
    if head_dim is not None:
        pairs = (int(head_dim * partial_rotary_factor) + 1) // 2
        if len(value) != pairs:
            raise ValueError(
                f"rope scaling {rope_type!r}: 'freq_factors' must have one entry per rotary "
                f"pair ({pairs}), got {len(value)}"
            )


#: the record this module adds to ``ROPE_SCALING``
FREQUENCY_FACTORS: dict[str, ScalingType] = {
    "freq_factors": ScalingType(
        freq_factors,
        required=frozenset({"freq_factors"}),
        optional=frozenset({"attention_factor"}),
        check=_check,
    )
}
