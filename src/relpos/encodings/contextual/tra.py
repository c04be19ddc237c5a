"""TRA: threshold relative attention (Opper, Fernandez, Smolensky, Gao 2025, "TRA: Better
Length Generalisation with Threshold Relative Attention", TMLR, arXiv 2503.23174; seed 59).

Selective sparsity (keys whose score is below a threshold leave the softmax) plus a
contextualised relative distance (only the kept keys are counted), modulated by a learnable
forget gate. Spec: remaining.md section 1 (authority C: the official repository holds only a
README; the formula is reconstructed from the abstract and a summary, see the class).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...functional import alibi_slopes
from ...registry import register
from ..base import BiasContext, Encoding
from ..options import Choice, Float

__all__ = ["TRA", "TRAData", "TRABlock"]


@dataclass
class TRAData:
    """The call's queries and keys (keys repeated to the query heads), from which each block
    takes its keep decisions on float64 scores."""

    q: Tensor  # (B, H, Lq, D)
    k: Tensor  # (B, H, Lk, D)


@dataclass
class TRABlock:
    """One block's float64 scores ``(B, H, T, S)``: the keep decisions read them, so every
    backend (and a cached decoding step) keeps the same keys whatever its matmul blocking."""

    score: Tensor


@register("tra")
class TRA(Encoding):
    """TRA, threshold relative attention (Opper et al. 2025, arXiv 2503.23174; spec
    remaining.md section 1, authority C).

        s_ij   = q_i . k_j * scale                               content logits
        m_ij   = 1[s_ij > threshold]  or  p_j == p_i              kept keys (own key always)
        c_ij   = sum_{t > j} m_it                                 kept keys between j and i
        logit  = s_ij - lambda_h * c_ij    if m_ij,   -inf otherwise
        lambda_h = -log sigmoid(f_h)                              learnable forget gate

    so a kept key's weight is multiplied by ``sigmoid(f_h) ** c_ij``: it decays with the number
    of *relevant* keys in between, not with the raw distance. Masked keys (causal: ``j > i``)
    are neither kept nor counted; without a causal mask every kept key right of ``j`` counts.

    Assumptions (the paper's formula could not be read: mopper97/TRA holds only a README;
    the abstract and a summary say "masking irrelevant keys by a threshold on the semantic
    scores, a contextualised distance over the remaining keys, modulated by a learnable forget
    gate, masked softmax"): the threshold acts on the scaled logit (default 0, i.e.
    ``sigmoid(s) > 1/2``, CoPE's gate made hard); the distance is exclusive of ``j`` (the
    query's own key is at distance 0); the query's own key (equal positions) is always kept so
    a self-attention row is never empty (a row whose own key is masked and whose other keys
    fall below the threshold gives 0, like any row without keys); ``f_h`` starts at ALiBi's
    slopes, ``lambda_h = m_h``.

    ``gate``: ``"hard"`` (default; the keep decision has no gradient, the kept logits and
    ``lambda`` train), ``"straight-through"`` (forward as hard; the count's gradient flows
    through ``sigmoid((s - threshold) / temperature)``), ``"soft"`` (a relaxation: ``m`` is
    that sigmoid, own key 1, and the logit is ``s + log m - lambda c`` on every key). Keep
    decisions are taken on float64 scores, so backends agree exactly on which keys are kept.

    Row-dependent (flag ``row_dependent``): backends ``eager`` and ``chunked`` only. Reads
    positions only to find the query's own key (shift-invariant: ``relative``).
    """

    paper = "Opper et al. 2025 (TRA)"
    has_bias = True
    row_dependent = True
    continuous = True
    options = {
        "threshold": Float(doc="keys with a scaled logit at or below it are removed"),
        "gate": Choice(
            choices=("hard", "straight-through", "soft"),
            doc="keep decision: hard, straight-through gradient, or a sigmoid relaxation",
        ),
        "temperature": Float(above=0.0, doc="sigmoid temperature of the relaxed gates"),
    }

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        threshold: float = 0.0,
        gate: str = "hard",
        temperature: float = 1.0,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.threshold, self.gate, self.temperature = threshold, gate, temperature
        slopes = alibi_slopes(num_heads).double()
        # lambda = softplus(-f) = -log sigmoid(f) starts at the ALiBi slopes
        self.forget = nn.Parameter((-torch.log(torch.expm1(slopes))).float())

    def decay(self) -> Tensor:
        """``lambda_h = -log sigmoid(f_h)``, shape ``(H,)``."""
        return F.softplus(-self.forget)

    def precompute(self, q: Tensor, k: Tensor, ctx: BiasContext, inputs: dict[str, Tensor]):
        if k.shape[1] != q.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        return TRAData(q=q, k=k)

    def block_context(self, ctx: BiasContext, i: Tensor, j: Tensor) -> BiasContext:
        data = ctx.data
        score = torch.matmul(
            data.q[:, :, i].double(), data.k[:, :, j].double().transpose(-1, -2)
        ) * float(ctx.scale)
        return BiasContext(
            q_pos=ctx.q_pos,
            k_pos=ctx.k_pos,
            data=TRABlock(score),
            scale=ctx.scale,
            positions=ctx.positions,
        )

    def _own(self, ctx: BiasContext, b: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return ctx.q_pos[b, i] == ctx.k_pos[b, j]

    def row_gates(
        self, ctx: BiasContext, s: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor
    ) -> Tensor:
        own = self._own(ctx, b, i, j)
        if self.gate == "soft":
            soft = torch.sigmoid((s.double() - self.threshold) / self.temperature)
            return torch.where(own, 1.0, soft)
        kept = ((ctx.data.score > self.threshold) | own).double()
        if self.gate == "straight-through":
            soft = torch.sigmoid((s.double() - self.threshold) / self.temperature)
            kept = kept + soft - soft.detach()
        return kept

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
        decayed = -self.decay().to(count.dtype)[h] * (count - g)  # keys kept right of j
        if self.gate == "soft":
            own = self._own(ctx, b, i, j)
            log_gate = F.logsigmoid((s.double() - self.threshold) / self.temperature)
            return decayed + torch.where(own, 0.0, log_gate)
        return torch.where(g.detach() > 0.5, decayed, float("-inf"))

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, threshold={self.threshold}, gate={self.gate!r}, "
            f"temperature={self.temperature}"
        )
