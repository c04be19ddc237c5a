"""The axis of each rotary pair in production multimodal RoPEs, for ``m-rope``'s
``axis_of_pair``.

relpos's ``m-rope`` takes positions ``(B, L, 3)`` as (time, height, width): axis 0 is time,
1 height, 2 width (``T``, ``H``, ``W`` below), the order in which these models' position
rows come. All three models use one shared spectrum ``theta_p = base^(-2p / r)`` over the
``r`` rotated channels (``m-rope``'s), and pair ``p`` turns by ``pos[axis[p]] * theta_p``; they
differ only in which axis drives pair ``p``:

* Ernie 4.5 VL (``ernie45_vl_axes``): ``mrope_section = [h, w, t]`` (Ernie's order), ``h == w``;
  the first ``h + w`` pairs alternate height (even ``p``) and width (odd ``p``), the last
  ``t`` take time. GPT-J pairs: ``layout="interleaved"``.
* Bailing / Ling (``bailing_axes``): ``mrope_section = [t, h, w]``, ``h == w``; the same
  alternation and time tail. GPT-J pairs (vLLM builds it with ``is_neox_style=False``):
  ``layout="interleaved"``, over the ``qk_rope_head_dim`` channels of its MLA heads.
* openPangu (``openpangu_axes``): ``mrope_section = [t, h, w]``; a greedy order that puts one
  time pair last and, before it, always the axis placed least so far relative to its count
  (ties to the lower axis), never the same axis twice in a row while another is left; e.g.
  ``0, 1, 2, 1, 2, 0, 1, 2, 0, ...`` for ``[16, 24, 24]``. NeoX halves (vLLM's default
  ``is_neox_style=True``): ``layout="half"``.

Usage::

    relpos.create("m-rope", num_heads=..., head_dim=128, base=theta, layout="interleaved",
                  axis_of_pair=ernie45_vl_axes([22, 22, 20]))

Sources read (the code here is a restatement, checked by
``tests/encodings/rotary/test_mrope_layouts.py``):

* vLLM ``vllm/model_executor/layers/rotary_embedding/ernie45_vl_rope.py``
  (``Ernie4_5_VLRotaryEmbedding``) and ``vllm/model_executor/models/ernie45_vl.py``;
  transformers ``models/ernie4_5_vl_moe/modeling_ernie4_5_vl_moe.py``
  (``Ernie4_5_VLMoeTextRotaryEmbedding``: its ``inv_freq`` permutation and
  ``recomposition_frequencies`` give the same layout);
* vLLM ``vllm/model_executor/layers/rotary_embedding/bailing_mrope.py``
  (``BailingMRotaryEmbedding.select_cos_sin``) and ``vllm/model_executor/models/
  bailing_moe_v3.py`` (transformers has no Bailing multimodal model);
* vLLM ``vllm/model_executor/layers/rotary_embedding/mrope_interleaved.py``
  (``MRotaryEmbeddingInterleaved.get_mrope_interleaved_id_list``, ``force_last=True``; earlier
  vLLM: ``openpangu_rope.py``) and ``vllm/model_executor/models/openpangu.py`` (transformers
  has no openPangu model).
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from ...validation import check_int_sequence

__all__ = ["T", "H", "W", "ernie45_vl_axes", "bailing_axes", "openpangu_axes"]

#: ``m-rope``'s position axes: time, height, width
T, H, W = 0, 1, 2


def _sections(value: object, name: str, model: str) -> tuple[int, ...]:
    return check_int_sequence(value, f"{model} {name}", length=3, minimum=0)


def _height_width_then_time(height: int, width: int, time: int, model: str) -> list[int]:
    if height != width:
        raise ValueError(
            f"{model} alternates height and width pairs, so its height and width sections "
            f"must be equal, got height={height}, width={width}"
        )
    return [H if p % 2 == 0 else W for p in range(height + width)] + [T] * time


def ernie45_vl_axes(mrope_section: Sequence[int]) -> list[int]:
    """Ernie 4.5 VL's pair axes from its ``mrope_section = [h, w, t]`` (Ernie's order; the
    config's ``rope_parameters["mrope_section"]``, default ``[22, 22, 20]``; vLLM derives it
    from ``freq_allocation`` as ``[(d/2 - t) / 2, (d/2 - t) / 2, t]``): pairs ``p < h + w``
    alternate height (even) and width (odd), the last ``t`` pairs take time.

    Both references slice the time pairs as ``[-t:]``, which takes every pair when
    ``t == 0``: a layout without time pairs is refused.
    """
    h, w, t = _sections(mrope_section, "mrope_section [h, w, t]", "Ernie 4.5 VL")
    if t == 0:
        raise ValueError(
            "Ernie 4.5 VL mrope_section [h, w, t] needs t >= 1: vLLM and transformers take "
            "the time pairs as the slice [-t:], which is every pair when t == 0"
        )
    return _height_width_then_time(h, w, t, "Ernie 4.5 VL")


def bailing_axes(mrope_section: Sequence[int]) -> list[int]:
    """Bailing / Ling M-RoPE's pair axes from its ``mrope_section = [t, h, w]`` (``h == w``):
    pairs ``p < h + w`` alternate height (even) and width (odd), the rest take time."""
    t, h, w = _sections(mrope_section, "mrope_section [t, h, w]", "Bailing M-RoPE")
    return _height_width_then_time(h, w, t, "Bailing M-RoPE")


def openpangu_axes(mrope_section: Sequence[int]) -> list[int]:
    """openPangu's interleaved M-RoPE pair axes from its ``mrope_section = [t, h, w]``.

    One time pair is held back and placed last; the other ``t - 1 + h + w`` pairs are placed
    one at a time: among the axes with pairs left, other than the one just placed (unless it
    is the only one left), the axis whose placed / total count is smallest (the lower axis on
    a tie). ``t >= 1`` (the layout always ends on a time pair). The two-section form
    ``[h, w]`` (no time axis, no held-back pair) is not an ``m-rope`` layout and is refused.
    """
    if isinstance(mrope_section, Sequence) and len(mrope_section) == 2:
        raise ValueError(
            "openPangu's two-section mrope_section [h, w] has no time axis; m-rope's axes are "
            "(t, h, w): pass the three-section [t, h, w] form"
        )
    t, h, w = _sections(mrope_section, "mrope_section [t, h, w]", "openPangu")
    if t == 0:
        raise ValueError(
            "openPangu mrope_section [t, h, w] needs t >= 1: its layout always ends on a time "
            f"pair, got {list(mrope_section)}"
        )
    totals = {T: t - 1, H: h, W: w}
    placed = dict.fromkeys(totals, 0)
    order: list[int] = []
    last: int | None = None
    for _ in range(sum(totals.values())):
        left = [a for a in totals if placed[a] < totals[a]]
        candidates = [a for a in left if a != last] or left
        last = min(candidates, key=lambda a: (Fraction(placed[a], totals[a]), a))
        order.append(last)
        placed[last] += 1
    return [*order, T]
