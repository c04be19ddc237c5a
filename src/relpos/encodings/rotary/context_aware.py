"""CARoPE, context-aware RoPE: token-dependent frequencies, phases summed over the prefix."""

from __future__ import annotations

import math
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..options import Float, Refused
from ..registry import register
from .headwise import group_mean, repeat_heads
from .rope import RoPE, rotate_pairs

__all__ = ["CARoPE", "inverse_softplus"]


def inverse_softplus(y: float) -> float:
    """``x`` with ``softplus(x) = y`` (``y > 0``), stable for small and large ``y``."""
    return y + math.log(-math.expm1(-y))


@register("carope")
class CARoPE(RoPE):
    """CARoPE, context-aware RoPE (Veisi et al. 2025, arXiv 2507.23083; from
    the paper's text, no code published).

    Token-dependent frequencies: ``f_t = 1 / (softplus(z_t) + 1)`` in ``(0, 1)`` per head,
    pair ``i`` turns at ``f_t^i`` (RoPE is ``f = theta_1 = base^(-2/d)``, as
    ``theta_i = theta_1^i``), and the phase is a sum over the prefix.

    What relpos assumes (the hooks see q, k and positions, not the layer input):

    * ``z_t = k_t . w_h + c_h``: the frequency is read from the token's *pre-rotation key*
      (the paper projects the layer input ``x_t W``, ``W (d_model, H)``, no bias);
      ``w = freq_weight (H, D)`` ~ N(0, 0.02^2) and ``c = freq_bias (H,)`` with
      ``f = theta_1`` at ``z = c``, so the encoding starts near RoPE (starting as RoPE
      needs such a bias).
    * Phases integrate over positions: ``phi_i(j) = sum_{t <= j} f_t^i (p_t - p_{t-1})``
      with ``p_{-1} = 0`` (0-based, including the token itself). With unit steps from 0 this
      is the paper's ``sum_{t=1}^{m} f_t^i``; with ``f = theta_1`` it is RoPE at any
      positions.
    * A query takes the phase of its own token: query ``i`` is key ``i + Lk - Lq`` (the
      bottom-right alignment ``relpos.attention`` uses), plus ``f^i`` times any difference
      between its position and that key's. Cross-attention with unrelated queries and keys
      is not meaningful; ``Lq > Lk`` raises.

    Consequences: phases of key ``j`` depend on keys ``<= j`` only, so causal decoding is
    exact, but keys cannot be cached rotated (``cache_rotated_keys = False``: ``relpos.nn``
    re-rotates the cache). The score depends on the tokens and position gaps between query
    and key, not on ``q_pos - k_pos`` alone: ``relative = False``. It is still unchanged
    when every position moves by the same constant. Powers ``f^i`` and the prefix sums are
    formed in float64 (they underflow / accumulate error in float32), the phases reduced
    modulo ``2 pi`` before the cast. With GQA, ``w`` and ``c`` are averaged over each query
    group (a key head has one frequency).

    Options: ``init_std``: std of ``w`` at init; ``base``, ``layout`` (default ``half``) and
    ``partial_rotary_factor`` as for ``rope`` (``theta_1 = base^(-2/r)`` over the ``r``
    rotated channels). ``scaling`` is refused: the frequencies are the tokens' ``f_t^i``, not
    RoPE's ``theta_i``, so no RoPE frequency scaling applies. Any activation dtype: the
    frequencies and phases are formed in float64 whatever the dtype of k and the parameters.
    Shapes: ``q (B, H, Lq, D)``, ``k (B, Hkv, Lk, D)``, ``q_pos (B|1, Lq)``, ``k_pos (B|1, Lk)``.
    """

    paper = "Veisi et al. 2025 (CARoPE)"
    relative = False
    cache_rotated_keys = False

    option_overrides = {
        "scaling": Refused(
            "carope's frequencies are token-dependent (f_t^i), not RoPE's theta_i: no RoPE "
            "frequency scaling applies"
        )
    }

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        init_std: Annotated[
            float, Float(minimum=0.0, doc="std of the frequency projection at init")
        ] = 0.02,
        **rope_options,
    ) -> None:
        super().__init__(num_heads, head_dim, **rope_options)
        rotated = int(head_dim * self.partial_rotary_factor)
        theta_1 = self.base ** (-2.0 / rotated)
        self.freq_weight = nn.Parameter(torch.randn(num_heads, head_dim) * init_std)
        self.freq_bias = nn.Parameter(torch.full((num_heads,), inverse_softplus(1 / theta_1 - 1)))

    def log_frequencies(self, k: Tensor) -> Tensor:
        """``log f (B, Hkv, Lk)`` float64, ``f`` in (0, 1), from pre-rotation keys
        ``k (B, Hkv, Lk, D)`` of any dtype."""
        kv_heads = k.shape[1]
        w = group_mean(self.freq_weight, kv_heads)
        c = group_mean(self.freq_bias, kv_heads)
        z = torch.einsum("bhld,hd->bhl", k.double(), w.double()) + c.double()[None, :, None]
        return -torch.log1p(F.softplus(z))

    def phases(
        self, k: Tensor, k_pos: Tensor, q_pos: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Key phases ``(B, Hkv, Lk, r/2)`` and, given ``q_pos (B|1, Lq)``, query phases
        ``(B, Hkv, Lq, r/2)``; float64, not reduced."""
        log_f = self.log_frequencies(k)
        pairs = torch.arange(self.inv_freq.numel(), dtype=torch.float64, device=k.device)
        powers = torch.exp(log_f[..., None] * pairs)  # f^i, (B, Hkv, Lk, F)
        kp = k_pos.double()
        steps = torch.cat((kp[:, :1], kp[:, 1:] - kp[:, :-1]), dim=1)
        k_phase = torch.cumsum(powers * steps[:, None, :, None], dim=2)
        if q_pos is None:
            return k_phase, None
        offset = k.shape[2] - q_pos.shape[1]
        gap = (q_pos.double() - kp[:, offset:])[:, None, :, None]
        return k_phase, k_phase[:, :, offset:] + powers[:, :, offset:] * gap

    def _rotate_by(self, x: Tensor, phase: Tensor) -> Tensor:
        phase = torch.remainder(phase, 2 * math.pi).float()
        phase = repeat_heads(phase, x.shape[1])
        return rotate_pairs(x, phase.cos(), phase.sin(), self.layout)

    def rotate_qk(
        self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor
    ) -> tuple[Tensor, Tensor]:
        self._check_qk(q, k)
        if q.shape[2] > k.shape[2]:
            raise ValueError(
                f"carope gives each query the phase of its own token, the key at index "
                f"i + Lk - Lq: q has length {q.shape[2]} > k length {k.shape[2]}"
            )
        k_phase, q_phase = self.phases(k, k_pos, q_pos)
        assert q_phase is not None
        return self._rotate_by(q, q_phase), self._rotate_by(k, k_phase)

    def rotate(self, x: Tensor, pos: Tensor, role: str) -> Tensor:
        if role == "k":
            self._check_head_dim(x, role)
            return self._rotate_by(x, self.phases(x, pos)[0])
        if role == "q":
            raise RuntimeError(
                "carope rotates queries with the phases of their keys: use rotate_qk "
                "(relpos.attention does)"
            )
        return x
