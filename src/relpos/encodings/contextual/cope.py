"""CoPE: contextual position encoding (Golovneva, Wang, Weston, Sukhbaatar 2024, "Contextual
Position Encoding: Learning to Count What's Important", arXiv 2405.18719).

Positions are counted from the content: a gate per key decides whether it counts, and the
position of key ``j`` seen from query ``i`` is the number of gated keys from ``j`` to ``i``.
No official repository: the form follows the paper's appendix listing, read through copies,
and lucidrains/x-transformers' port of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch
from torch import Tensor, nn

from ..base import BiasContext, Encoding
from ..options import Bool, Int
from ..registry import register

__all__ = ["CoPE", "CoPEData", "interpolate_position_logits"]


@dataclass
class CoPEData:
    """CoPE's per-call data: ``z = q @ E``, ``(B, H, Lq, npos_max)`` (unscaled queries)."""

    z: Tensor


def interpolate_position_logits(
    z: Tensor, positions: Tensor, b: Tensor, h: Tensor, i: Tensor
) -> Tensor:
    """CoPE's bias at fractional positions: ``z_i[ceil p] * w + z_i[floor p] * (1 - w)`` with
    ``w = p - floor p``. ``z (B, H, Lq, N)`` position logits, ``positions`` already clamped to
    ``[0, N - 1]`` and broadcasting with the index grids ``b, h, i``. The gradient reaches ``p``
    through ``w`` (the floor and ceiling are constants), as in the paper's listing."""
    low = positions.floor()
    w = positions - low
    z_low = z[b, h, i, low.long()]
    z_high = z[b, h, i, positions.ceil().long()]
    return z_high * w + z_low * (1 - w)


@register("cope")
class CoPE(Encoding):
    """CoPE, contextual position encoding (Golovneva et al. 2024, arXiv 2405.18719; the
    paper's appendix listing, read through copies).

        s_ij   = q_i . k_j * scale                       (B, H, Lq, Lk) content logits
        g_ij   = sigmoid(s_ij)                           0 on masked keys (causal: j > i)
        p_ij   = min(sum_{t >= j} g_it, npos_max - 1)    the counted position of key j
        z_i    = q_i @ E                                 (B, H, Lq, npos_max), q unscaled
        b_ij   = z_i[ceil p_ij] * w + z_i[floor p_ij] * (1 - w),   w = p_ij - floor p_ij
        logit  = s_ij + b_ij

    With a causal mask the sum runs over ``t = j .. i`` and includes the query's own key, so
    ``p_ii = sigmoid(s_ii) > 0``. Without one (``causal=False``, or ``relpos.scores``) every
    visible key right of ``j`` counts, which is what the listing computes without its causal
    mask. ``E (1 | H, head_dim, npos_max)`` is zero-initialised (the listing's init, kept by
    ``relpos.nn`` models): training starts as plain attention. The listing is single-head, so
    sharing ``E`` across heads is relpos's default; ``per_head=True`` gives each head its own.

    The term reads the whole row of logits (flag ``row_dependent``): backends ``eager`` and
    ``chunked`` (key blocks right to left with the suffix sum carried); ``sdpa`` and ``flex``
    refuse it. Positions are never read (the logits are invariant to any shift, so the
    encoding is ``relative`` and ``continuous`` in relpos's sense). KV-cache decoding works:
    a cached query's row sees all cached keys, and rows are independent.
    """

    paper = "Golovneva et al. 2024 (CoPE)"
    has_bias = True
    row_dependent = True
    continuous = True
    keeps_own_init = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        npos_max: Annotated[
            int, Int(minimum=2, doc="number of position embeddings (positions clamp below)")
        ] = 64,
        per_head: Annotated[
            bool, Bool(doc="one embedding table E per head (default: shared by the heads)")
        ] = False,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.npos_max, self.per_head = npos_max, per_head
        self.pos_emb = nn.Parameter(torch.zeros(num_heads if per_head else 1, head_dim, npos_max))

    @classmethod
    def example_options(cls) -> dict:
        return {"npos_max": 12}  # counted positions of the test lengths reach the clamp

    def precompute(self, q: Tensor, k: Tensor, ctx: BiasContext, inputs: dict[str, Tensor]):
        """``z = q @ E`` on the unscaled queries: ``(B, H, Lq, npos_max)``."""
        return CoPEData(z=torch.matmul(q, self.pos_emb.to(q.dtype)))

    def row_gates(
        self, ctx: BiasContext, s: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor
    ) -> Tensor:
        return torch.sigmoid(s)

    def row_bias(
        self,
        ctx: BiasContext,
        s: Tensor,
        g: Tensor,
        count: Tensor,
        b: Tensor,
        h: Tensor,
        i: Tensor,
        j: Tensor,
    ) -> Tensor:
        positions = count.clamp(max=self.npos_max - 1)
        return interpolate_position_logits(ctx.data.z, positions, b, h, i)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, npos_max={self.npos_max}, per_head={self.per_head}"
