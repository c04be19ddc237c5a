"""Rotation times a decaying envelope: xPos and hyperbolic-rope.

Both multiply RoPE's rotation of pair ``i`` by ``e^{-a_i (n - c)}`` on the query at ``n`` and
``e^{+a_i (m - c)}`` on the key at ``m``, so the score of the pair carries
``e^{-a_i (n - m)}``: it decays with the distance to keys in the past (both are causal). xPos
fixes ``a_i = -ln(zeta_i) / scale_base``; hyperbolic-rope learns ``a_i``.

Numerics. The centre ``c`` cancels in ``q . k``, but each factor alone spans
``e^{a_i * span}``: formed for all positions of a long call around one centre they overflow
float32 (the old behaviour: NaN past ~141 x scale_base of key span). Here the centre is the
midpoint of the *query* positions of each call (per batch row), and the exponents are
formed in float64 from ``n - c`` and ``m - c`` (exact for positions below 2^53). With the
budget ``E`` of the activation dtype (``envelope_budget``: 80 for float32 and bfloat16, whose
envelope is formed in float32; 690 for float64, whose envelope stays float64; 7.09 for
float16):

* query exponents are at most ``a_max * S_q / 2`` (``S_q``: the span of the call's query
  positions); ``relpos.attention`` cuts a call where that would exceed ``E / 2`` into blocks
  of consecutive queries, each with its own centre (``query_span_limit``,
  ``attention/query_split.py``; exact, since rows are independent), and ``rotate_qk`` itself
  raises ``ValueError`` naming ``q_pos`` for such a span (``relpos.scores``, direct calls);
* key exponents are clamped at ``E / 2``: only keys in the future of every query of the
  call are affected (causal attention never sees them), and every logit stays finite,
  future ones included (below ``e^E |q| |k|``);
* keys far in the past underflow to 0, where their exact contribution is below
  ``e^{E/2 - 103}`` relative to ``|q| |k|`` (float32; ``e^{E/2 - 744}`` in float64).

Guarantee: through ``relpos.attention`` at any query span (per block: ``S_q <= E / a_max``,
``64 x scale_base`` for xPos in float32 and bfloat16, 32K positions at the default 512,
``550 x scale_base`` in float64, ``5.6 x scale_base`` in float16), every visible score is
exact to float32 rounding (the precision
of RoPE's angles; float16 / bfloat16 to their own) at any key span and any position offset
that float64 represents, and no logit is infinite or NaN.
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor, nn

from ..options import Float
from ..registry import register
from .rope import ROPE_LAYOUT, RoPE, rotate_pairs

__all__ = ["XPos", "HyperbolicRoPE", "envelope_budget"]


def envelope_budget(dtype: torch.dtype) -> float:
    """The largest envelope exponent ``E`` a logit of activations of ``dtype`` may carry
    (``E / 2`` each on q and k), below the overflow of the dtype the envelope is formed in
    with a margin for ``|q| |k|``: 80 for float32 / bfloat16 (float32 overflows at e^88.7),
    690 for float64 (its envelope stays float64; overflow at e^709.8), ``ln(65504) - 4 =
    7.09`` for float16."""
    if dtype == torch.float64:
        return 690.0
    return min(80.0, math.log(torch.finfo(dtype).max) - 4.0)


#: xPos's ``B`` (``scale_base``), also taken by hyperbolic-rope
SCALE_BASE = Float(above=0.0, doc="xPos's B: decay by zeta_i per B positions")


@register("xpos")
class XPos(RoPE):
    """xPos / LeX Transformer (Sun et al. 2022, "A Length-Extrapolatable Transformer", arXiv
    2212.10554; official code microsoft/torchscale ``component/xpos_relative_position.py``).

    RoPE (interleaved layout by default, as in torchscale) times a per-pair exponential
    scale: ``zeta_i = (2i + 0.4 r) / (1.4 r)`` over the ``r`` rotated channels
    (``r = head_dim`` unless ``partial_rotary_factor`` < 1); query at n:
    ``RoPE(q, n) * zeta^((n - c) / B)``; key at m: ``RoPE(k, m) * zeta^(-(m - c) / B)``. The
    score then carries ``zeta_i^((n - m)/B)``, which decays with distance for keys in the
    past: xPos is causal. ``B = scale_base`` (512). The centre ``c`` cancels in q.k; it is
    the midpoint of each call's query positions (module docstring: exact at any key span),
    so ``relpos.nn`` caches raw keys (``cache_rotated_keys = False``). ``rotate`` alone
    (one role) uses ``c = 0``, torchscale's convention (finite for ``|p| <= 40 / a_max``).

    Every RoPE option applies to the rotation (``base``, ``layout``,
    ``partial_rotary_factor``, ``scaling``: scaled frequencies, attention factor on both);
    the envelope stays xPos's.

    Args:
        scale_base: ``B`` (> 0), the distance over which pair ``i`` decays by ``zeta_i``.
        layout: ``"interleaved"`` (torchscale) by default.
        **rope_options: as for ``rope``.
    Shapes: ``x (B, H, L, D)``, ``pos (B|1, L)``.
    """

    paper = "Sun et al. 2022 (xPos)"
    causal_only = True
    continuous = False
    cache_rotated_keys = False

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        scale_base: Annotated[float, SCALE_BASE] = 512.0,
        layout: Annotated[str, ROPE_LAYOUT] = "interleaved",
        **rope_options,
    ) -> None:
        super().__init__(num_heads, head_dim, layout=layout, **rope_options)
        self.scale_base = scale_base
        r = self.rotary_dim
        zeta = (torch.arange(0, r, 2, dtype=torch.float64) + 0.4 * r) / (1.4 * r)
        self.register_buffer("zeta", zeta.float(), persistent=False)

    def decay_rates(self) -> Tensor:
        """``a (r/2,)`` float64: pair ``i``'s envelope decays by ``e^{-a_i}`` per unit
        distance; ``-ln(zeta_i) / scale_base`` for xPos."""
        return -torch.log(self.zeta.to(torch.float64)) / self.scale_base

    def query_span_limit(self, dtype: torch.dtype) -> float | None:
        """``E / a_max``: the query span whose exponents reach the per-side budget ``E / 2``
        (module docstring); ``relpos.attention`` splits wider calls into query blocks."""
        top_rate = float(self.decay_rates().detach().amax()) if self.zeta.numel() else 0.0
        return envelope_budget(dtype) / top_rate if top_rate > 0 else None

    def _scaled(self, x: Tensor, pos: Tensor, exponent: Tensor, seq_len: int | None) -> Tensor:
        """``x`` rotated and scaled by ``e^{exponent}`` (``(B|1, 1, L, r/2)`` float64), the
        envelope kept in float64 for float64 activations, else float32."""
        cos, sin = self.cos_sin(pos, seq_len)
        scale = torch.exp(exponent)
        if x.dtype != torch.float64:
            scale = scale.to(torch.float32)
        return rotate_pairs(x, cos * scale, sin * scale, self.layout)

    def rotate_qk(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> tuple[Tensor, Tensor]:
        self._check_qk(q, k)
        if q_pos.numel() == 0 or k_pos.numel() == 0:
            return q, k  # nothing to scale (L = 0)
        seq_len = None
        if self.length_dependent:
            seq_len = self.call_length(("q_pos", q_pos), ("k_pos", k_pos))
        rates = self.decay_rates().to(q_pos.device)
        top_rate = float(rates.detach().amax()) if rates.numel() else 0.0
        qp = q_pos.to(torch.float64)
        low, high = qp.amin(-1, keepdim=True), qp.amax(-1, keepdim=True)  # (B|1, 1)
        center = (low + high) / 2  # exact in float64: q and k exponents both within span / 2
        budget = envelope_budget(q.dtype) / 2  # per side: q and k exponents
        widest = float((high - low).amax()) / 2 * top_rate
        if widest > budget:
            span = float((high - low).amax())
            raise ValueError(
                f"q_pos spans {span:g} positions in one call; {self.name} scales queries by "
                f"up to e^(a_max * span / 2) = e^{widest:.1f}, above the {q.dtype} budget "
                f"e^{budget:.1f}: give at most {2 * budget / top_rate:.0f} query "
                f"positions per call (relpos.attention splits wider calls into query blocks; "
                f"relpos.scores and direct rotate_qk calls do not) or a larger decay length"
            )
        q_exp = -(qp - center)[:, None, :, None] * rates
        k_rel = (k_pos.to(torch.float64) - center)[:, None, :, None]
        k_exp = (k_rel * rates).clamp(max=budget)  # only far-future keys are clamped
        return (
            self._scaled(q, q_pos, q_exp, seq_len),
            self._scaled(k, k_pos, k_exp, seq_len),
        )

    def rotate(self, x: Tensor, pos: Tensor, role: str) -> Tensor:
        if role not in ("q", "k"):
            return x
        self._check_head_dim(x, role)
        sign = -1.0 if role == "q" else 1.0
        rel = pos.to(torch.float64)[:, None, :, None]
        seq_len = self.call_length((f"{role}_pos", pos)) if self.length_dependent else None
        return self._scaled(x, pos, sign * rel * self.decay_rates().to(pos.device), seq_len)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scale_base={self.scale_base:g}"


@register("hyperbolic-rope")
class HyperbolicRoPE(XPos):
    """Hyperbolic rotary PE, "HoPE" of Dai et al. 2025 (arXiv 2509.05218; only the abstract was
    available and no code is published: the form below is a reconstruction). Not the HoPE of
    ``hope``.

    The abstract: RoPE's rotations become Lorentz transformations built from hyperbolic
    functions, RoPE is a special case, attention decays monotonically with distance. A 2x2
    boost ``B(phi) = [[cosh, sinh], [sinh, cosh]]`` is relative only under the Minkowski
    form ``B(a)^T eta B(b) = eta B(b - a)``, ``eta = diag(1, -1)``; along its light-cone
    directions ``(1, +-1)`` it scales by ``e^{+-phi}``, so a score ``q^T eta B((n - m)k) k``
    has one sector that decays and one that grows with distance.

    What relpos assumes: only the decaying light-cone sector is kept, one rapidity rate
    ``kappa_i > 0`` per RoPE pair. The query at ``m`` is scaled by ``e^{-kappa_i m}`` and
    the key at ``n`` by ``e^{+kappa_i n}`` on top of the rotation by ``p theta_i``, so pair
    ``i`` of the score is ``e^{-kappa_i (m - n)}`` times its RoPE term: for keys in the past
    the envelope decays strictly monotonically, ``kappa = 0`` is RoPE. Learned:
    ``log_rate (r/2,)``, ``kappa = exp(log_rate)`` (positive), initialised to
    ``-ln(zeta_i) / scale_base`` with xPos's ``zeta_i``: at init this *is* xPos, of which
    the assumed form is the learned, continuous-position generalisation.

    Like xPos it is causal (future keys would grow) and centres the exponents on the
    midpoint of each call's query positions (module docstring), so keys are cached raw
    (``cache_rotated_keys = False``).

    Args:
        scale_base: xPos's ``B`` for the init.
        layout: ``"half"`` by default.
        **rope_options: as for ``rope``.
    Shapes: ``x (B, H, L, D)``, ``pos (B|1, L)``.
    """

    paper = "Dai et al. 2025 (Hyperbolic HoPE)"
    continuous = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        scale_base: Annotated[float, SCALE_BASE] = 512.0,
        layout: Annotated[str, ROPE_LAYOUT] = "half",
        **rope_options,
    ) -> None:
        super().__init__(num_heads, head_dim, scale_base=scale_base, layout=layout, **rope_options)
        rates = -torch.log(self.zeta.double()) / self.scale_base
        self.log_rate = nn.Parameter(torch.log(rates).float())

    @property
    def rates(self) -> Tensor:
        """``kappa (r/2,)``: the decay rate of each pair's envelope per unit distance."""
        return self.log_rate.exp()

    def decay_rates(self) -> Tensor:
        return self.rates.to(torch.float64)

    def extra_repr(self) -> str:
        return RoPE.extra_repr(self)
