"""ALiBi: attention with linear biases (Press et al. 2021, "Train Short, Test Long",
arXiv 2108.12409), in its causal, symmetric, asymmetric and shifted encoder forms.

``b_h(i, j) = -m_h (i - j)`` with per-head slopes ``m_h`` (``functional.alibi_slopes``);
``bias_at_distance(h (..), distance (..)) -> (..)``. Official code read:
ofirpress/attention_with_linear_biases (``get_slopes``) and its README's FAQ.
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor, nn

from ...functional import alibi_slopes
from ...validation import check_choice
from ..options import Bool, Custom, Int
from ..registry import register
from .distance import DistanceBias, LinearPiece

__all__ = ["ALiBi"]

FORMS = ("causal", "symmetric", "asymmetric", "shifted")


def alibi_form(bidirectional: object, name: str = "bidirectional") -> str:
    """The ALiBi form named by ``bidirectional``: ``False`` -> ``"causal"``, ``True`` ->
    ``"symmetric"``, or one of ``FORMS`` by name. ``TypeError`` for other types,
    ``ValueError`` for other strings."""
    if bidirectional is False:
        return "causal"
    if bidirectional is True:
        return "symmetric"
    if not isinstance(bidirectional, str):
        raise TypeError(
            f"{name} must be a bool or one of {', '.join(map(repr, FORMS))}, got {bidirectional!r}"
        )
    return check_choice(bidirectional, name, FORMS)


BIDIRECTIONAL = Custom(
    checker=alibi_form,
    invalid=[("no", ValueError), (3, TypeError), (None, TypeError)],
    doc="False/'causal', True/'symmetric', 'asymmetric' or 'shifted'",
)


@register("alibi")
class ALiBi(DistanceBias):
    """ALiBi (Press et al. 2021, "Train Short, Test Long", arXiv 2108.12409).

    ``b_h(i, j) = -m_h * d`` with ``d = i - j``: the causal form, the paper's. Slopes ``m_h``
    from ``functional.alibi_slopes`` (exact for any head count). relpos uses the explicit
    ``-m (i - j)`` matrix, not the ``m * j`` trick that is exact only under a causal mask.

    ``bidirectional`` picks the encoder form (the paper covers causal LMs only):

    * ``False`` / ``"causal"``: ``-m_h d`` (future keys get ``+m_h |d|``; mask them).
    * ``True`` / ``"symmetric"``: ``-m_h |d|``, the maintainers' encoder form
      (ofirpress/attention_with_linear_biases issue #5; NVIDIA/NeMo's ALiBi module).
    * ``"asymmetric"``: ``-m_h d`` for past keys (``d >= 0``) and ``-m'_h |d|`` for future keys,
      with a second slope set ``m'``: the even-indexed slopes of a ``2 T``-head model
      (``alibi_slopes(2 T)[0::2]``, ``T = total_heads``), which lie between the standard ones on the
      log scale (``m'_h = 2^(4/T) m_h`` for ``T`` a power of two). Neither the paper nor its code
      gives slopes for this form (relpos's own choice); this default keeps the past side identical
      to ALiBi and tells the two sides apart in every head.
    * ``"shifted"``: ``-m_h (|d| - 0.5 [d > 0])``, the deterministic encoder ALiBi of
      google-deepmind/randomized_positional_encodings (Ruoss et al. 2023, "Randomized Positional
      Encodings Boost Length Generalization of Transformers", arXiv 2305.16843): past keys get half
      a slope more than future keys at the same distance.

    ``learnable_slopes=True`` makes the slopes (both sets) per-head parameters initialised to
    the values above and kept positive as ``m = exp(log_m)`` (as x-transformers'
    ``LearnedAlibiPositionalBias``; the paper has no learnable form).

    Tensor parallelism: a shard that holds heads ``head_offset .. head_offset + H - 1`` of a
    model with ``total_heads`` heads gets exactly those heads' slopes
    (``alibi_slopes(total_heads)[head_offset : head_offset + H]``); concatenating the shards'
    ``slopes`` gives the full model's.

    Shapes: ``slopes (H,)``; ``bias_at_distance(h, distance)`` broadcasts its index tensors.
    """

    paper = "Press et al. 2021 (ALiBi)"
    continuous = True
    FORMS = FORMS

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        bidirectional: Annotated[bool | str, BIDIRECTIONAL] = False,
        learnable_slopes: Annotated[
            bool, Bool(doc="slopes as per-head parameters (log-parametrised)")
        ] = False,
        head_offset: Annotated[
            int, Int(minimum=0, doc="first head of this tensor-parallel shard")
        ] = 0,
        total_heads: Annotated[
            int | None, Int(optional=True, doc="heads of the whole model (None: num_heads)")
        ] = None,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.form = alibi_form(bidirectional)
        total = num_heads if total_heads is None else total_heads
        if head_offset + num_heads > total:
            raise ValueError(
                f"head_offset + num_heads must be <= total_heads: this shard holds heads "
                f"{head_offset}..{head_offset + num_heads - 1} of total_heads={total}"
            )
        self.head_offset, self.total_heads = head_offset, total
        self.learnable_slopes = learnable_slopes
        shard = slice(head_offset, head_offset + num_heads)
        self._slope_set("slopes", alibi_slopes(total)[shard])
        if self.form == "asymmetric":
            self._slope_set("future_slopes", alibi_slopes(2 * total)[0::2][shard])

    def _slope_set(self, name: str, values: Tensor) -> None:
        """Fixed slopes as a (non-persistent) buffer, learnable ones as ``log_<name>``."""
        if self.learnable_slopes:
            setattr(self, f"log_{name}", nn.Parameter(values.log()))
        else:
            self.register_buffer(f"_{name}", values, persistent=False)

    def _get(self, name: str) -> Tensor:
        if self.learnable_slopes:
            return getattr(self, f"log_{name}").exp()
        return getattr(self, f"_{name}")

    @property
    def bidirectional(self) -> bool:
        """Whether the bias is meant for non-causal attention (any form but ``"causal"``)."""
        return self.form != "causal"

    @property
    def slopes(self) -> Tensor:
        """``(H,)`` slopes ``m_h`` (of past keys, for the asymmetric form)."""
        return self._get("slopes")

    @property
    def future_slopes(self) -> Tensor:
        """``(H,)`` slopes of future keys: ``m'`` for the asymmetric form, ``m`` otherwise."""
        return self._get("future_slopes") if self.form == "asymmetric" else self.slopes

    def bias_at_distance(self, h: Tensor, distance: Tensor) -> Tensor:
        m = self.slopes
        d = distance.to(m.dtype)
        if self.form == "causal":
            return -m[h] * d
        if self.form == "symmetric":
            return -m[h] * d.abs()
        if self.form == "shifted":
            return -m[h] * (d.abs() - 0.5 * (d > 0).to(d.dtype))
        return -torch.where(d >= 0, m[h] * d, self.future_slopes[h] * -d)

    def linear_pieces(self) -> list[LinearPiece]:
        """Every form is piecewise linear in ``d``: causal ``-m d`` is one line; symmetric
        ``-m d`` for ``d >= 0`` and ``+m d`` below; asymmetric ``-m d`` / ``+m' d``; shifted
        ``-m (d - 0.5)`` for ``d >= 1`` and ``+m d`` for ``d <= 0``."""
        m = self.slopes
        if self.form == "causal":
            return [LinearPiece(-m)]
        if self.form == "shifted":
            return [LinearPiece(-m, 0.5, low=1), LinearPiece(m, 0.0, high=0)]
        return [LinearPiece(-m, 0.0, low=0), LinearPiece(self.future_slopes, 0.0, high=-1)]

    def extra_repr(self) -> str:
        out = f"{super().extra_repr()}, bidirectional={self.form!r}"
        if self.learnable_slopes:
            out += ", learnable_slopes=True"
        if self.total_heads != self.num_heads:
            out += f", head_offset={self.head_offset}, total_heads={self.total_heads}"
        return out
