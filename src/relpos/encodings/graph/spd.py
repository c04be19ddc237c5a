"""Shortest-path ALiBi (Gurev & Rumbell 2025, arXiv 2506.19834): ALiBi's per-head slopes
times the hop count between two nodes, ``b_h(i, j) = -m_h SPD(i, j)``.

Inputs: ``adjacency (B, N, N)`` or the precomputed ``spd (B, N, N)``
(``relpos.graphs.shortest_path_distances``). No code was found and only the abstract was read
("A standard transformer and attention with linear biases for molecular conformer generation").
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated

import torch
from torch import Tensor

from ...functional import alibi_slopes
from ...graphs import shortest_path_distances
from ...validation import check_float
from ..options import Custom, Int
from ..registry import register
from .base import (
    DEFAULT_MAX_NODES,
    MAX_NODES,
    GraphEncoding,
    check_structure,
    example_forest,
    structure_or_adjacency,
)

__all__ = ["ShortestPathALiBi"]


def unreachable_policy(value: object, name: str) -> str | float:
    """``"cap"``, ``"mask"`` or a distance (a finite number >= 0) for unreachable pairs."""
    if isinstance(value, str):
        if value not in ("cap", "mask"):
            raise ValueError(f"{name} must be 'cap', 'mask' or a number >= 0, got {value!r}")
        return value
    return check_float(value, name, minimum=0.0)


def check_spd(value: object) -> Tensor:
    """``inputs['spd']``: ``(B, N, N)`` hop counts ``>= 0``, ``inf`` = unreachable."""
    return check_structure(value, "spd", "(B, N, N)", dims=3, minimum=0.0, allow_inf=True)


UNREACHABLE = Custom(
    checker=unreachable_policy,
    invalid=[
        ("far", ValueError),
        (float("nan"), ValueError),
        (-1.0, ValueError),
        (True, TypeError),
        (object(), TypeError),
    ],
    doc="'cap', 'mask' or the distance of unreachable pairs",
)


@register("graph-spd")
class ShortestPathALiBi(GraphEncoding):
    """ALiBi over shortest-path distances (Gurev & Rumbell 2025, arXiv 2506.19834;
    abstract only, no code).

    ``b_h(i, j) = -m_h * SPD(i, j)`` with the ALiBi slopes ``m_h`` (``alibi_slopes``),
    symmetric, no causal mask. Assumed where the paper is silent: ``max_spd`` caps distances
    (None: no cap); unreachable pairs (different components) get ``unreachable``: ``"cap"``
    = the distance ``max_spd + 1`` (or the node count N without a cap), ``"mask"`` = no
    attention (-inf; a node always reaches itself, so no row is empty), or a number >= 0 =
    that distance. Inputs: ``adjacency (B, N, N)`` or precomputed ``spd (B, N, N)``
    (``relpos.graphs.shortest_path_distances``, ``inf`` = unreachable).
    """

    paper = "Gurev & Rumbell 2025 (shortest-path ALiBi, molecular conformers)"
    structure_input = "spd"
    optional_inputs = {
        "adjacency": "(B, N, N) bool",
        "spd": "(B, N, N) float hop counts, inf = unreachable",
    }

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        max_spd: Annotated[
            int | None, Int(minimum=0, optional=True, doc="cap on the hop count (None: no cap)")
        ] = None,
        unreachable: Annotated[str | float, UNREACHABLE] = "cap",
        max_nodes: Annotated[int, MAX_NODES] = DEFAULT_MAX_NODES,
    ) -> None:
        super().__init__(num_heads, head_dim, max_nodes=max_nodes)
        self.max_spd = max_spd
        self.unreachable = unreachable
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    def structure(self, inputs):
        spd = structure_or_adjacency(inputs, "spd", check_spd, shortest_path_distances).float()
        if self.max_spd is not None:
            spd = torch.where(torch.isinf(spd), spd, spd.clamp(max=self.max_spd))
        if self.unreachable == "mask":
            return spd
        if self.unreachable == "cap":
            far = self.max_spd + 1 if self.max_spd is not None else spd.shape[1]
        else:
            far = float(self.unreachable)
        return torch.where(torch.isinf(spd), torch.full_like(spd, far), spd)

    def bias(self, ctx, b, h, i, j):
        return -self.slopes[h] * self.pair(ctx, b, i, j)

    @classmethod
    def example_inputs(cls, batch, length_q, length_k, generator):
        return {"spd": _example_spd(batch)}


@lru_cache(maxsize=4)
def _example_spd(batch: int) -> Tensor:
    return shortest_path_distances(example_forest(batch, DEFAULT_MAX_NODES, 0)[1])
