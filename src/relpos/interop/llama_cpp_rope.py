"""llama.cpp's RoPE conventions as relpos encodings.

llama.cpp does not store a rope type in a GGUF file: ``llama_model_rope_type``
(ggml-org/llama.cpp ``src/llama-model.cpp``) derives it from ``general.architecture``, and
``ggml_rope_ext`` / ``ggml_rope_multi`` (``ggml/src/ggml-cpu/ops.cpp``) apply it. With
``n_dims`` rotated channels, ``theta_scale = base^(-2 / n_dims)`` and pair ``j``'s angle
``p * theta_scale^j`` (divided by ``rope_freqs[j]`` when the file has that tensor):

* ``NORMAL`` (0): pairs ``(2j, 2j + 1)``: relpos ``rope`` with ``layout="interleaved"``;
* ``NEOX`` (2): pairs ``(j, j + n_dims/2)``: ``rope`` with ``layout="half"``;
* ``MROPE`` (8): NEOX pairs; ``sections = [t, h, w, e]`` give pair ``j`` (``sector = j mod
  sum(sections)``) the position of the section it falls in, contiguous, one shared spectrum:
  ``m-rope`` (``mrope_section=[t, h, w]``) when ``e == 0``, else ``rope-hierarchical`` with
  four levels (any contiguous sections over one spectrum);
* ``IMROPE`` (40, Qwen3-VL): NEOX pairs; ``sector % 3 == 1`` and ``< 3 h`` take h,
  ``% 3 == 2`` and ``< 3 w`` take w, ``% 3 == 0`` and ``< 3 t`` take t, every other pair the
  fourth position e: ``m-rope`` with ``interleaved_sections=True`` and the three sections
  when no pair falls to e, else with the four sections (positions ``(B, L, 4)``; Qwen3-VL's
  ``[24, 20, 20, 0]`` over 64 pairs sends pairs 61 and 62 to e, which transformers' Qwen3-VL
  turns by t instead);
* ``VISION`` (24, the clip / mtmd vision towers): ``n_dims = head_dim / 2`` and pairs
  ``(j, j + n_dims)`` over the whole head; the spectrum restarts in every section
  (``theta_scale^(j - start)``): ``rope-axial`` (per-axis spectra) with ``layout="half"`` and
  per-axis bases ``base^(2 n_a / n_dims)`` so that ``base_a^(-k / n_a) = base^(-2k / n_dims)``.

The position rows are llama.cpp's: for MROPE / IMROPE it gives every token 4 rows, and for
the tokens its language model decodes it fills the fourth with 0 (``llm_graph_input_pos::
set_input`` in ``src/llama-graph.cpp``: text tokens ``(p, p, p, 0)``; ``decode_embd_batch``
in ``tools/mtmd/mtmd-helper.cpp``: image tokens ``(p0, p0 + y, p0 + x, 0)``, video
``(p0 + t, p0 + y, p0 + x, 0)``, audio ``(p, p, p, 0)``), so the pairs on e never turn there.
``llama_cpp_positions`` builds these rows from relpos's three.

``LLAMA_CPP_ROPE_TYPES`` lists the architectures whose type is read here (a subset of
``llama_model_rope_type``; others raise ``ValueError`` naming the architecture).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "IMROPE",
    "LLAMA_CPP_ROPE_TYPES",
    "MROPE",
    "NEOX",
    "NORMAL",
    "VISION",
    "imrope_pair_axes",
    "llama_cpp_positions",
    "mrope_pair_axes",
    "rope_encoding",
    "rope_type_of",
    "vision_pair_frequencies",
]

NORMAL, NEOX, MROPE, VISION, IMROPE = 0, 2, 8, 24, 40  # GGML_ROPE_TYPE_*

#: ``general.architecture -> rope type`` (llama.cpp ``llama_model_rope_type``)
LLAMA_CPP_ROPE_TYPES: dict[str, int] = {
    **dict.fromkeys(
        (
            "llama",
            "deci",
            "baichuan",
            "internlm2",
            "minicpm",
            "command-r",
            "cohere2",
            "olmo",
            "deepseek",
            "deepseek2",
            "chatglm",
            "granite",
            "granitemoe",
        ),
        NORMAL,
    ),
    **dict.fromkeys(
        (
            "falcon",
            "qwen",
            "qwen2",
            "qwen2moe",
            "qwen3",
            "qwen3moe",
            "phi2",
            "phi3",
            "gemma",
            "gemma2",
            "gemma3",
            "stablelm",
            "starcoder2",
            "olmo2",
            "olmoe",
            "hunyuan-dense",
        ),
        NEOX,
    ),
    "qwen2vl": MROPE,
    **dict.fromkeys(("qwen3vl", "qwen3vlmoe"), IMROPE),
}


def rope_type_of(architecture: str) -> int:
    """llama.cpp's rope type of a GGUF ``general.architecture``."""
    try:
        return LLAMA_CPP_ROPE_TYPES[architecture]
    except KeyError:
        raise ValueError(
            f"llama.cpp rope type of architecture {architecture!r} is not known here; known: "
            f"{sorted(LLAMA_CPP_ROPE_TYPES)}"
        ) from None


def _sections(sections: Sequence[int]) -> list[int]:
    values = [int(s) for s in sections] + [0] * (4 - len(sections))
    if len(values) != 4 or any(s < 0 for s in values) or sum(values) == 0:
        raise ValueError(
            f"rope.dimension_sections must be up to 4 non-negative pair counts, not all 0, "
            f"got {list(sections)}"
        )
    return values


def mrope_pair_axes(sections: Sequence[int], pairs: int) -> list[int]:
    """The position axis (0 t, 1 h, 2 w, 3 e) of each of ``pairs`` rotary pairs in llama.cpp's
    ``MROPE`` (``ggml_mrope_cache_init``, contiguous sectors, ``sector = j mod sum``)."""
    t, h, w, _ = s = _sections(sections)
    axes = []
    for j in range(pairs):
        sector = j % sum(s)
        axes.append(0 if sector < t else 1 if sector < t + h else 2 if sector < t + h + w else 3)
    return axes


def imrope_pair_axes(sections: Sequence[int], pairs: int) -> list[int]:
    """The position axis of each pair in llama.cpp's ``IMROPE`` (``is_imrope`` branch)."""
    t, h, w, _ = s = _sections(sections)
    axes = []
    for j in range(pairs):
        sector = j % sum(s)
        if sector % 3 == 1 and sector < 3 * h:
            axes.append(1)
        elif sector % 3 == 2 and sector < 3 * w:
            axes.append(2)
        elif sector % 3 == 0 and sector < 3 * t:
            axes.append(0)
        else:
            axes.append(3)
    return axes


def llama_cpp_positions(positions: Tensor) -> Tensor:
    """The four position rows llama.cpp gives a token of its MROPE / IMROPE language model
    (module docstring), ``(..., L, 4)`` int64, from relpos's ``(..., L, 3)`` ``(t, h, w)`` ids
    (``relpos.positions_nd.multimodal_position_ids``) or 1-D text positions ``(..., L)``
    (every row that position): the fourth row, e, is 0."""
    if not isinstance(positions, Tensor) or positions.is_floating_point():
        raise TypeError(
            "positions must be an integer tensor of text positions (..., L) or (t, h, w) ids "
            f"(..., L, 3), got {positions!r:.80}"
        )
    if positions.dim() >= 2 and positions.shape[-1] == 3:
        rows = positions.long()
    elif positions.dim() >= 1:
        rows = positions.long()[..., None].expand(*positions.shape, 3)
    else:
        raise ValueError("positions must have at least one axis (the tokens)")
    return torch.cat((rows, torch.zeros_like(rows[..., :1])), -1)


def vision_pair_frequencies(
    sections: Sequence[int], head_dim: int, base: float
) -> list[tuple[int, float]]:
    """``(axis, frequency)`` of each of the ``head_dim / 2`` pairs of llama.cpp's ``VISION``
    mode (``indep_sects``: the spectrum restarts at every section), ``n_dims = head_dim / 2``."""
    s = _sections(sections)
    n_dims = head_dim // 2
    starts = [0, s[0], s[0] + s[1], s[0] + s[1] + s[2]]
    out = []
    for j in range(n_dims):
        sector = j % sum(s)
        axis = max(a for a in range(4) if starts[a] <= sector and s[a] > 0)
        out.append((axis, float(base) ** (-2.0 * (sector - starts[axis]) / n_dims)))
    return out


def rope_encoding(
    rope_type: int,
    *,
    head_dim: int,
    base: float,
    rotary_dim: int | None = None,
    sections: Sequence[int] | None = None,
) -> tuple[str, dict[str, Any]]:
    """``(encoding name, options)`` of relpos that computes llama.cpp's rope ``rope_type``
    exactly (module docstring), or ``ValueError`` naming what has no exact counterpart.

    ``rotary_dim`` is ``n_rot`` (``{arch}.rope.dimension_count``, default ``head_dim``);
    ``sections`` is ``{arch}.rope.dimension_sections`` (MROPE / IMROPE / VISION).
    """
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    if rotary_dim > head_dim or rotary_dim % 2 or rotary_dim < 2:
        raise ValueError(
            f"rope dimension_count must be an even number in [2, head_dim={head_dim}], got "
            f"{rotary_dim}"
        )
    common: dict[str, Any] = {"base": float(base)}
    if rotary_dim != head_dim:
        common["partial_rotary_factor"] = rotary_dim / head_dim
    if rope_type == NORMAL:
        return "rope", {**common, "layout": "interleaved"}
    if rope_type == NEOX:
        return "rope", {**common, "layout": "half"}
    if rope_type in (MROPE, IMROPE):
        if sections is None:
            raise ValueError("llama.cpp MROPE / IMROPE needs rope.dimension_sections")
        s = _sections(sections)
        pairs = rotary_dim // 2
        if sum(s) != pairs:
            raise ValueError(
                f"rope.dimension_sections {s} must cover the {pairs} rotary pairs exactly "
                f"(llama.cpp repeats shorter sections cyclically; relpos does not)"
            )
        if rope_type == MROPE:
            if s[3] == 0:
                return "m-rope", {**common, "mrope_section": s[:3]}
            return "rope-hierarchical", {**common, "levels": 4, "sections": s}
        if 3 in imrope_pair_axes(s, pairs):
            # pairs on the fourth position: m-rope's fourth axis, llama.cpp's rule
            return "m-rope", {**common, "mrope_section": s, "interleaved_sections": True}
        return "m-rope", {**common, "mrope_section": s[:3], "interleaved_sections": True}
    if rope_type == VISION:
        if sections is None:
            raise ValueError("llama.cpp VISION rope needs the sections of its axes")
        if rotary_dim != head_dim:
            raise ValueError("llama.cpp VISION rope rotates the whole head (n_dims = head_dim/2)")
        table = vision_pair_frequencies(sections, head_dim, base)
        axes = [a for a, _ in table]
        counts = [axes.count(a) for a in range(4)]
        used = [a for a in range(4) if counts[a]]
        contiguous = axes == sorted(axes)
        if not contiguous or used != list(range(len(used))):
            raise ValueError(
                f"llama.cpp VISION sections {list(sections)} wrap around the {head_dim // 2} "
                f"pairs; relpos's rope-axial needs one contiguous section per axis"
            )
        n_dims = head_dim // 2
        bases = [float(base) ** (2 * counts[a] / n_dims) for a in used]
        return "rope-axial", {
            "dims": len(used),
            "sections": [counts[a] for a in used],
            "base": bases,
            "layout": "half",
        }
    raise ValueError(
        f"unknown llama.cpp rope type {rope_type!r}; known: NORMAL 0, NEOX 2, MROPE 8, "
        f"VISION 24, IMROPE 40"
    )
