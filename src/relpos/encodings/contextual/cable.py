"""Cable: context-aware biases for length extrapolation ("Context-aware Biases for Length
Extrapolation", arXiv 2503.08067; official code axiomlab/Cable, ``src/Cable.py``).

Each token gets a learned, content-dependent "slope" ``softplus(u_t)``; the bias between two
tokens is minus the sum of the slopes between them: ALiBi whose slope is read from the
content. The official code was read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..base import BiasContext, Encoding
from ..bias.distance import accurate_dtype
from ..options import Bool, Float, Int
from ..registry import register

__all__ = ["Cable", "CableContext"]


@dataclass
class CableContext:
    """Cumulative slopes of a call: ``c_k (B, H, Lk)`` of the keys and ``c_q (B, H, Lq)``
    of the queries (the last ``Lq`` keys), float32."""

    c_q: Tensor
    c_k: Tensor


@register("cable")
class Cable(Encoding):
    """Cable, context-aware biases for length extrapolation (arXiv 2503.08067;
    official code axiomlab/Cable, ``src/Cable.py``).

    Per token ``t`` and head ``h`` a learned score ``u_{t,h}``; its softplus is the token's
    own "slope", accumulated along the sequence:

        c_{t,h} = sum_{s <= t} softplus(u_{s,h})        (the official b = -c)
        b_h(i, j) = -(c_{i,h} - c_{j,h}) = -sum_{s=j+1}^{i} softplus(u_{s,h})   for j <= i

    ``<= 0``, ``0`` on the diagonal; ALiBi is the case ``softplus(u) = m_h``. ``i`` and ``j``
    index tokens in sequence order (query ``i`` is key token ``i + Lk - Lq``, the causal
    alignment), so positions are not read at all. For future keys (non-causal calls) relpos
    uses ``-|c_i - c_j|`` (a symmetric extension; the paper is decoder-only and masks them).

    What ``u`` is computed from. The official code applies ``Linear(n_embd, H)`` to the layer
    input ``x`` (after ``ln_1``). At the attention level relpos has the keys, so by default
    ``u_{t,h} = w_h . k_{t,g(h)} + beta_h`` with ``w (H, head_dim)``, ``beta (H,)``, and
    ``g(h)`` the key head of query head ``h`` (grouped-query attention). Since
    ``k = W_k x``, this is the official projection restricted to the row space of ``W_k``;
    it needs nothing but the keys, so decoding with a KV cache works unchanged (each call
    re-accumulates ``c`` over the cached keys, O(L)). With ``input_dim=C`` the encoding owns
    the official ``Linear(C, H)`` and reads the hidden states as
    ``inputs={"x": (B, Lk, C)}`` (the ``Lk`` key tokens; with a KV cache the caller keeps
    ``x`` of every cached token). Init: nanoGPT's (weights ``N(0, init_std^2)``, 0.02 by
    default, bias 0), so ``softplus(u) ~ ln 2`` at init: ALiBi with slope ~0.693 on every head.

    Scale: the official code does not divide ``q . k`` by ``sqrt(d)`` (``q / sqrt(C / n_embd)``
    with ``C == n_embd``); relpos follows it by default (``default_scale = 1``) and
    ``scaled=True`` restores ``1/sqrt(head_dim)``. A ``scale=`` passed to ``relpos.attention``
    overrides both.
    """

    paper = "Cable (axiomlab, context-aware biases for length extrapolation)"
    has_bias = True
    continuous = True
    optional_inputs = {
        "x": "(B, Lk, input_dim) float hidden states of the key tokens (needs input_dim=...)"
    }

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        input_dim: Annotated[
            int | None, Int(optional=True, doc="hidden size C of inputs['x'] (None: read keys)")
        ] = None,
        scaled: Annotated[
            bool, Bool(doc="divide q . k by sqrt(head_dim) (the official code does not)")
        ] = False,
        init_std: Annotated[
            float, Float(minimum=0.0, doc="std of the score projection's initial weights")
        ] = 0.02,
    ) -> None:
        super().__init__(num_heads, head_dim)
        self.scaled = scaled
        self.input_dim = input_dim
        if self.input_dim is None:
            self.weight = nn.Parameter(torch.randn(num_heads, head_dim) * init_std)
            self.bias_u = nn.Parameter(torch.zeros(num_heads))
        else:
            self.proj = nn.Linear(self.input_dim, num_heads)
            nn.init.normal_(self.proj.weight, std=init_std)
            nn.init.zeros_(self.proj.bias)

    def default_scale(self, head_dim: int) -> float:
        return head_dim**-0.5 if self.scaled else 1.0

    def token_scores(self, k: Tensor, inputs: dict[str, Tensor]) -> Tensor:
        """``u (B, H, Lk)``: from ``inputs["x"]`` with ``input_dim``, else from the keys."""
        x = inputs.get("x")
        if self.input_dim is None:
            if x is not None:
                raise ValueError(
                    "inputs['x'] is read only by a cable encoding created with input_dim=C "
                    "(the hidden size of x); this one computes its scores from the keys"
                )
            keys = k.repeat_interleave(self.num_heads // k.shape[1], dim=1)
            return (
                torch.einsum("bhld,hd->bhl", keys.to(self.weight.dtype), self.weight)
                + (self.bias_u[:, None])
            )
        B, Lk = k.shape[0], k.shape[2]
        if x is None:
            raise ValueError(
                f"this cable encoding (input_dim={self.input_dim}) needs "
                f"inputs={{'x': (B, Lk, {self.input_dim}) hidden states of the key tokens}}"
            )
        if not isinstance(x, Tensor) or not x.is_floating_point():
            got = x.dtype if isinstance(x, Tensor) else type(x).__name__
            raise TypeError(f"inputs['x'] must be a floating-point tensor, got {got}")
        if x.shape != (B, Lk, self.input_dim):
            raise ValueError(
                f"inputs['x'] must have shape (B, Lk, input_dim) = {(B, Lk, self.input_dim)}, "
                f"got {tuple(x.shape)}"
            )
        return self.proj(x.to(self.proj.weight.dtype)).transpose(1, 2)

    def precompute(
        self, q: Tensor, k: Tensor, ctx: BiasContext, inputs: dict[str, Tensor]
    ) -> CableContext:
        Lq, Lk = q.shape[2], k.shape[2]
        if Lq > Lk:
            raise ValueError(
                f"cable reads each query's token among the keys (query i is key i + Lk - Lq): "
                f"q has {Lq} queries but k only {Lk} keys"
            )
        u = self.token_scores(k, inputs)
        # cumulative "position" c_t in float64 (float32 on MPS), stored in float32
        c = torch.cumsum(F.softplus(u).to(accurate_dtype(u.device)), dim=-1).float()
        return CableContext(c_q=c[..., Lk - Lq :], c_k=c)

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        data: CableContext = ctx.data
        return -(data.c_q[b, h, i] - data.c_k[b, h, j]).abs()

    def extra_repr(self) -> str:
        out = f"{super().extra_repr()}, scaled={self.scaled}"
        return out + (f", input_dim={self.input_dim}" if self.input_dim is not None else "")
