"""GRIT's relative random-walk probabilities as a learned pair encoding (Ma et al. 2023,
"Graph Inductive Biases in Transformers without Message Passing", arXiv 2305.17589;
LiamMa/GRIT).

``P_ij = [I, M, ..., M^(K-1)]_ij`` with ``M = D^-1 A``; bias ``b_h(i, j) = P_ij . w_h`` and,
optionally, a value term. Inputs: ``adjacency (B, N, N)`` or the precomputed ``rrwp (B, N, N,
K)`` (``relpos.graphs.random_walk_probabilities``). Official code read: LiamMa/GRIT.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated

import torch
from torch import Tensor, nn

from ...graphs import random_walk_probabilities
from ..options import Bool, Int
from ..registry import register
from .base import (
    DEFAULT_MAX_NODES,
    MAX_NODES,
    GraphEncoding,
    check_structure,
    example_forest,
    structure_or_adjacency,
)

__all__ = ["RandomWalkPairEncoding"]


@register("grit-rrwp")
class RandomWalkPairEncoding(GraphEncoding):
    """GRIT's relative random-walk probabilities as a learned pair encoding (Ma et al. 2023,
    "Graph Inductive Biases in Transformers without Message Passing"; LiamMa/GRIT).

    ``P_ij = [I, M, ..., M^(K-1)]_ij`` with ``M = D^-1 A`` (``relpos.graphs.
    random_walk_probabilities``), ``K = steps``. Bias ``b_h(i, j) = P_ij . w_h`` with
    ``w = Linear(K, H, bias=False)`` (xavier-uniform, as GRIT's RRWP encoder). With
    ``values=True`` the pair encoding also enters the values as in GRIT's attention,
    ``out_i += W_Ev,h (sum_j p_ij P_ij)`` with ``W_Ev (H, K, Dv)``. GRIT's full layer
    (signed-sqrt edge updates) is a model, not a positional encoding: only the RRWP pair
    encoding and its two uses are here. Inputs: ``adjacency`` or precomputed
    ``rrwp (B, N, N, K)`` (finite).
    """

    paper = "Ma et al. 2023 (GRIT, RRWP)"
    structure_input = "rrwp"
    optional_inputs = {
        "adjacency": "(B, N, N) bool",
        "rrwp": "(B, N, N, K) random-walk probabilities",
    }

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        steps: Annotated[int, Int(doc="K: random-walk channels I, M, ..., M^(K-1)")] = 8,
        values: Annotated[bool, Bool(doc="also add GRIT's value term")] = False,
        max_nodes: Annotated[int, MAX_NODES] = DEFAULT_MAX_NODES,
    ) -> None:
        super().__init__(num_heads, head_dim, max_nodes=max_nodes)
        self.steps = steps
        self.weight = nn.Parameter(nn.init.xavier_uniform_(torch.empty(num_heads, steps)))
        self.has_value_term = values
        if values:
            w = torch.empty(num_heads, steps, head_dim)
            self.value_weight = nn.Parameter(nn.init.xavier_normal_(w))

    def check_rrwp(self, value: object) -> Tensor:
        """``inputs['rrwp']``: ``(B, N, N, steps)`` finite probabilities."""
        form = f"(B, N, N, {self.steps})"
        return check_structure(value, "rrwp", form, dims=4, last=self.steps)

    def structure(self, inputs):
        rrwp = structure_or_adjacency(
            inputs, "rrwp", self.check_rrwp, lambda a: random_walk_probabilities(a, self.steps)
        )
        return rrwp.float()

    def bias(self, ctx, b, h, i, j):
        s = ctx.data.structure
        qn, kn = ctx.q_pos[b, i], ctx.k_pos[b, j]
        out = s[b, qn, kn, 0] * self.weight[h, 0]
        for step in range(1, self.steps):  # element-wise (a FlexAttention score_mod)
            out = out + s[b, qn, kn, step] * self.weight[h, step]
        return out

    def value_term(self, ctx, p, b, h, i, j):
        s = ctx.data.structure
        B = p.shape[0]
        bi = torch.arange(B, device=p.device)[:, None, None]
        pairs = s[bi, ctx.q_pos[:, i.reshape(-1)][:, :, None], ctx.k_pos[:, j.reshape(-1)][:, None]]
        mixed = torch.einsum("bhts,btsk->bhtk", p, pairs.to(p.dtype))  # (B, H, T, K)
        return torch.einsum("bhtk,hkd->bhtd", mixed, self.value_weight.to(p.dtype))

    @classmethod
    def example_inputs(cls, batch, length_q, length_k, generator):
        return {"rrwp": _example_rrwp(batch, 8)}


@lru_cache(maxsize=4)
def _example_rrwp(batch: int, steps: int) -> Tensor:
    return random_walk_probabilities(example_forest(batch, DEFAULT_MAX_NODES, 0)[1], steps)
