"""NTK-family scalings defined outside ``transformers``' shared table: NTK by ``alpha``
(Hunyuan, XD-RoPE) and the fixed / mixed NTK of vLLM's ``"ntk"`` type.

Both are static (no ``seq_len``); the signature is the one of every type
(``relpos.rope_scaling.methods``), ``dim`` the number of rotated channels.

* ``ntk_alpha``: the NTK-aware base ``b' = b * alpha^(d / (d - 2))`` with a fixed ``alpha``.
  Hunyuan checkpoints label it ``{"rope_type": "dynamic", "alpha": a}``; transformers
  (``models/hunyuan_v1_dense/modeling_hunyuan_v1_dense.py``,
  ``compute_ntk_alpha_rope_parameters``) and vLLM
  (``vllm/model_executor/layers/rotary_embedding/dynamic_ntk_alpha_rope.py``) both read it as
  this static base, so ``validate_scaling`` resolves such a dict to ``ntk_alpha``. Hunyuan's
  configs also carry ``factor``, ``beta_fast``, ``beta_slow``, ``mscale`` and
  ``mscale_all_dim``, which neither stack reads: they are accepted and ignored
  (``HUNYUAN_IGNORED``).
* ``xdrope``: vLLM's XD-RoPE dict (``xdrope.py``: ``{"rope_type": "xdrope", "alpha": a,
  "xdrope_section": [...]}``): the ``ntk_alpha`` frequencies; the sections say which position
  axis drives each pair (``relpos.encodings.rotary.nd.XDRoPE``). With one position per token
  (text) every axis carries it and the sections do not matter.
* ``ntk_mixed``: vLLM's ``"ntk"`` (``ntk_scaling_rope.py``, after Su Jianlin,
  https://kexue.fm/archives/9706). Pair ``i = 0 .. d/2 - 1`` is divided by ``lambda_i``:
  without ``mixed_b`` (fixed NTK) ``theta_i = (b s)^(-2i/d) / s^(2/d)``, i.e.
  ``lambda_i = s^((2i + 2)/d)``; with ``mixed_b`` ``lambda_i = exp(a (i + 1)^mixed_b)``,
  ``a = ln s / (d/2)^mixed_b``. Both divide the lowest frequency by exactly ``s``. Not
  relpos's ``ntk`` (bloc97's base ``b s^(d/(d-2))``, which keeps the highest frequency).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from .methods import _plain_inv_freq, ntk_scaled_base
from .scaling_type import ScalingType, check_number, is_number

__all__ = ["NTK_VARIANTS", "ntk_alpha", "ntk_mixed"]


def ntk_alpha(
    dim: int,
    base: float,
    params: Mapping,
    *,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    head_dim: int | None = None,
) -> tuple[Tensor, float]:
    """NTK by a fixed ``alpha`` (Hunyuan): ``theta_i = (b alpha^(d/(d-2)))^(-2i/d)``, float32
    as transformers forms it; attention factor 1. Static (unlike ``dynamic``)."""
    return _plain_inv_freq(dim, ntk_scaled_base(base, params["alpha"], dim)), 1.0


def ntk_mixed(
    dim: int,
    base: float,
    params: Mapping,
    *,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    head_dim: int | None = None,
) -> tuple[Tensor, float]:
    """vLLM's ``"ntk"``: fixed NTK, or mixed NTK with ``mixed_b`` (module docstring), in
    vLLM's float32 order of operations; attention factor 1."""
    factor = params["factor"]
    mixed_b = params.get("mixed_b")
    if mixed_b is None:
        return _plain_inv_freq(dim, base * factor) / factor ** (2 / dim), 1.0
    a = torch.tensor(factor).log() / (dim / 2) ** mixed_b
    pairs = _plain_inv_freq(dim, base).numel()
    lam = (a * torch.arange(1, pairs + 1).float() ** mixed_b).exp()
    return _plain_inv_freq(dim, base) / lam, 1.0


def _check_alpha(params: Mapping[str, Any], rope_type: str, **_: Any) -> None:
    """``alpha`` stretches the base: a number ``>= 1``."""
    check_number(params, "alpha", rope_type, minimum=1.0)


def _check_xdrope(params: Mapping[str, Any], rope_type: str, **_: Any) -> None:
    _check_alpha(params, rope_type)
    section = params["xdrope_section"]
    if not (
        isinstance(section, list)
        and section
        and all(is_number(s) and float(s).is_integer() and s >= 0 for s in section)
    ):
        raise ValueError(
            f"rope scaling {rope_type!r}: 'xdrope_section' must be a list of non-negative "
            f"pair counts (one per position axis), got {section!r}"
        )


def _check_mixed(params: Mapping[str, Any], rope_type: str, **_: Any) -> None:
    check_number(params, "factor", rope_type, minimum=1.0)
    check_number(params, "mixed_b", rope_type, minimum=0.0, strict=True)


#: keys Hunyuan's ``dynamic`` + ``alpha`` configs carry and no stack reads
HUNYUAN_IGNORED = frozenset({"factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"})

#: the records this module adds to ``ROPE_SCALING``
NTK_VARIANTS: dict[str, ScalingType] = {
    "ntk_alpha": ScalingType(
        ntk_alpha, required=frozenset({"alpha"}), optional=HUNYUAN_IGNORED, check=_check_alpha
    ),
    "xdrope": ScalingType(
        ntk_alpha,
        required=frozenset({"alpha", "xdrope_section"}),
        optional=HUNYUAN_IGNORED,
        check=_check_xdrope,
    ),
    "ntk_mixed": ScalingType(
        ntk_mixed,
        required=frozenset({"factor"}),
        optional=frozenset({"mixed_b"}),
        check=_check_mixed,
    ),
}
