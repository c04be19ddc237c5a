"""Reading-order relative positions on a document's word graph (``reading-order``).

C.-Y. Lee, Li, Dozat, Perot, Su, Hua, Ainslie, Pfister ("ROPE: Reading Order Equivariant Positional
Encoding for Graph-based Document Information Extraction", ACL 2021, arXiv 2106.10786). No code was
found; only the abstract and introduction were read. The claim: each neighbour of a target word gets
a code of its reading order *relative to the target among the target's neighbours*, which improves
GCNs on form understanding (FUNSD, payment documents) by up to 8.4 F1.

Reconstruction (assumed where the text was not reachable): sort ``N(t) ∪ {t}`` by reading
index; the code of neighbour ``u`` is ``r(t, u) = rank(u) - rank(t)`` (so ``r(t, t) = 0``). It is
the order among the neighbours, not the index gap: inserting words that are not neighbours
of ``t`` leaves ``t``'s codes unchanged. Here the code selects a learned per-head bias of
the attention from ``t`` (query) to ``u`` (key): ``b_h(t, u) = W_h[clip(r(t, u), -R, R)]`` on
adjacent pairs (and the diagonal); other pairs are masked (message passing over the word
graph, the default) or get one learned bias per head (``mask_non_adjacent=False``). The
paper embeds the code by a sinusoid or a table into the edge message of a GCN; the table form
as an attention bias is relpos's mapping.

Inputs (per call): ``adjacency (B, N, N)`` and ``reading_order (B, N)`` (each node's reading
index, distinct within a graph), or the precomputed ``reading_codes (B, N, N)``
(``reading_order_codes``; ``NO_EDGE`` for non-adjacent pairs). Positions are node ids
(``GraphEncoding``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated

import torch
from torch import Tensor, nn

from ...graphs import check_adjacency
from ..base import BiasContext
from ..options import Bool, Int
from ..registry import register
from .base import DEFAULT_MAX_NODES, MAX_NODES, GraphEncoding, check_structure, example_forest

__all__ = ["NO_EDGE", "ReadingOrderBias", "reading_order_codes"]

#: the code of a pair that is not adjacent (``reading_order_codes``)
NO_EDGE = -(2**31)


def reading_order_codes(adjacency: Tensor, order: Tensor) -> Tensor:
    """``r (B, N, N)`` int64: ``r[b, t, u] = rank(u) - rank(t)`` in the reading order of
    ``N(t) ∪ {t}`` for adjacent ``u`` (0 for ``u = t``), ``NO_EDGE`` elsewhere.
    ``adjacency (B, N, N)`` (``check_adjacency``), ``order (B, N)`` reading indices (distinct
    within a graph). Example: target 3 with neighbours {1, 4, 5} gets codes
    {1: -1, 4: +1, 5: +2}."""
    adj = check_adjacency(adjacency, "inputs['adjacency']")
    B, N, _ = adj.shape
    if not isinstance(order, Tensor) or order.is_complex() or order.dtype == torch.bool:
        raise TypeError("inputs['reading_order'] must be a real (B, N) tensor of reading indices")
    if order.dim() != 2 or order.shape[1] != N or order.shape[0] not in (1, B):
        raise ValueError(
            f"inputs['reading_order'] must have shape (B, N) = ({B}, {N}), got {tuple(order.shape)}"
        )
    order = order.expand(B, N).to(adj.device)
    if order.is_floating_point() and not bool(torch.isfinite(order).all()):
        raise ValueError("inputs['reading_order'] must be finite")
    if bool((order.sort(1).values[:, 1:] == order.sort(1).values[:, :-1]).any()):
        raise ValueError("inputs['reading_order'] must hold distinct reading indices per graph")
    member = adj | torch.eye(N, dtype=torch.bool, device=adj.device)  # N(t) ∪ {t}
    before = (order[:, :, None] < order[:, None, :]).to(torch.float64)  # [v, u]: v reads first
    rank = torch.bmm(member.to(torch.float64), before).round().long()  # [t, u]: rank in S_t
    code = rank - rank.diagonal(dim1=1, dim2=2)[:, :, None]
    return code.masked_fill(~member, NO_EDGE)


def check_codes(value: object) -> Tensor:
    return check_structure(value, "reading_codes", "(B, N, N) integer codes", dims=3, integer=True)


@register("reading-order")
class ReadingOrderBias(GraphEncoding):
    """``b_h(t, u) = W_h[clip(r(t, u), -R, R)]`` over the word graph (see the module).

    Args:
        max_code: ``R``, codes are clipped to ``-R .. R`` (8).
        mask_non_adjacent: mask pairs that are not adjacent (default), else give them a learned
            per-head bias.
        max_nodes: as every graph encoding.
    """

    paper = "Lee et al. 2021 (ROPE, reading-order equivariant PE for documents)"
    structure_input = "reading_codes"
    optional_inputs = {
        "adjacency": "(B, N, N) bool word graph",
        "reading_order": "(B, N) reading index of each node",
        "reading_codes": "(B, N, N) integer codes (reading_order_codes)",
    }

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        max_code: Annotated[int, Int(minimum=1, doc="R: codes clipped to -R .. R")] = 8,
        mask_non_adjacent: Annotated[bool, Bool(doc="mask pairs that are not adjacent")] = True,
        max_nodes: Annotated[int, MAX_NODES] = DEFAULT_MAX_NODES,
    ) -> None:
        super().__init__(num_heads, head_dim, max_nodes=max_nodes)
        self.max_code, self.mask_non_adjacent = max_code, mask_non_adjacent
        self.table = nn.Parameter(torch.zeros(num_heads, 2 * max_code + 1))
        self.far = None if mask_non_adjacent else nn.Parameter(torch.zeros(num_heads))

    def structure(self, inputs: dict[str, Tensor]) -> Tensor:
        if "reading_codes" in inputs:
            return check_codes(inputs["reading_codes"])
        if "adjacency" not in inputs or "reading_order" not in inputs:
            raise ValueError(
                "pass inputs={'adjacency': (B, N, N), 'reading_order': (B, N)} or the "
                "precomputed 'reading_codes' (B, N, N)"
            )
        return reading_order_codes(inputs["adjacency"], inputs["reading_order"])

    def bias(self, ctx: BiasContext, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        code = self.pair(ctx, b, i, j)
        edge = code != NO_EDGE
        w = self.table[h, code.clamp(-self.max_code, self.max_code) + self.max_code]
        other = torch.full_like(w, -torch.inf) if self.far is None else self.far[h].expand_as(w)
        return torch.where(edge, w, other)

    @classmethod
    def example_inputs(cls, batch, length_q, length_k, generator):
        return {"reading_codes": _example_codes(batch)}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, max_code={self.max_code}"


@lru_cache(maxsize=4)
def _example_codes(batch: int) -> Tensor:
    _, adj = example_forest(batch, DEFAULT_MAX_NODES, 0)
    order = torch.randperm(DEFAULT_MAX_NODES, generator=torch.Generator().manual_seed(1))
    return reading_order_codes(adj, order[None].expand(batch, -1))
