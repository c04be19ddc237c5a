"""``GraphEncoding``: the base of graph and tree encodings, and their per-call inputs.

Positions are node ids: query ``i`` is node ``q_pos[b, i]`` of graph ``b`` and key ``j`` is
node ``k_pos[b, j]`` (default ``0..N-1``: every node attends to every node). The structure
comes per call as ``relpos.attention(..., inputs={"adjacency": (B, N, N)})`` (dense, bool or
0/1; padded nodes have no edges, mask them with ``mask``) or, computed once per graph and
reused by every layer, as the derived tensor (``"spd"``, ``"rrwp"``, ``"relations"``).
``relpos.graphs`` builds padded adjacencies from edge lists and computes the structures.

The structural tensors are ``(B, N, N[, K])``: a graph bias is a function of the node pair,
not of a distance, so it has no O(L) form; the backends still never build anything larger
than a ``(B, H, T, S)`` tile from them. Every input is checked before use: a wrong type is a
``TypeError``, a wrong shape or a NaN / out-of-range entry a ``ValueError`` naming the input
(``inputs['adjacency']`` ...).

The encodings: ``spd.py`` (shortest-path ALiBi), ``rrwp.py`` (GRIT's random-walk pair
encoding), ``tree.py`` (tree / trie relations).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated

import torch
from torch import Tensor

from ...graphs import check_adjacency, tree_relations
from ..base import BiasContext, Encoding
from ..options import Int

__all__ = [
    "DEFAULT_MAX_NODES",
    "MAX_NODES",
    "GraphEncoding",
    "GraphStructure",
    "check_structure",
    "example_forest",
    "example_relations",
    "structure_or_adjacency",
]

DEFAULT_MAX_NODES = 1024
#: the spec of ``max_nodes``, the option every graph encoding takes
MAX_NODES = Int(doc="largest node count of a graph (positions < max_nodes)")


@dataclass
class GraphStructure:
    """The call's structure tensor expanded to the batch: ``(B, N, N[, K])``."""

    structure: Tensor


def check_structure(
    value: object,
    name: str,
    form: str,
    *,
    dims: int,
    last: int | None = None,
    integer: bool = False,
    minimum: float | None = None,
    allow_inf: bool = False,
) -> Tensor:
    """Check a precomputed structure tensor ``inputs[name]`` of ``form`` (e.g.
    ``"(B, N, N)"``): ``dims`` axes, square node axes, the last axis ``last`` long,
    integer entries (``integer``) or real ones without NaN (and without infinities unless
    ``allow_inf``), every entry ``>= minimum``."""
    label = f"inputs[{name!r}]"
    if not isinstance(value, Tensor) or value.is_complex() or value.dtype == torch.bool:
        got = value.dtype if isinstance(value, Tensor) else type(value).__name__
        raise TypeError(f"{label} must be a {form} tensor, got {got}")
    if integer and value.is_floating_point():
        raise TypeError(f"{label} must be an integer {form} tensor, got {value.dtype}")
    shaped = value.dim() == dims and value.shape[1] == value.shape[2]
    if not shaped or (last is not None and value.shape[-1] != last):
        raise ValueError(f"{label} must have shape {form}, got {tuple(value.shape)}")
    if value.numel() == 0:
        return value
    if value.is_floating_point():
        if bool(torch.isnan(value).any()):
            raise ValueError(f"{label} must not contain NaN")
        if not allow_inf and bool(torch.isinf(value).any()):
            raise ValueError(f"{label} must be finite (no inf)")
    if minimum is not None and bool((value < minimum).any()):
        raise ValueError(f"{label} entries must be >= {minimum:g}")
    return value


def structure_or_adjacency(
    inputs: dict[str, Tensor],
    name: str,
    check: Callable[[object], Tensor],
    compute: Callable[[Tensor], Tensor],
) -> Tensor:
    """``inputs[name]`` checked by ``check``, else ``compute`` of the checked
    ``inputs['adjacency']``; ``ValueError`` naming both when neither is given."""
    if name in inputs:
        return check(inputs[name])
    if "adjacency" not in inputs:
        raise ValueError(f"pass inputs={{'adjacency': (B, N, N)}} or the precomputed {name!r}")
    return compute(check_adjacency(inputs["adjacency"], "inputs['adjacency']"))


def largest_node_id(ctx: BiasContext) -> int:
    """The largest node id (position) of the call, 0 for an empty one. One host sync; the
    engine's per-call position fact is to provide it and replace this helper."""
    if ctx.q_pos.numel() == 0 or ctx.k_pos.numel() == 0:
        return 0
    return int(max(ctx.q_pos.max(), ctx.k_pos.max()))


@lru_cache(maxsize=8)
def example_forest(batch: int, nodes: int, seed: int) -> tuple[Tensor, Tensor]:
    """Random forests (parent pointers and symmetric adjacency) of ``nodes`` nodes: each node
    attaches to an earlier one, except every 97th node, which starts a new tree (so some
    pairs are unreachable)."""
    gen = torch.Generator().manual_seed(seed)
    n = torch.arange(nodes)
    parent = (torch.rand(batch, nodes, generator=gen) * n).long()
    parent[:, n % 97 == 0] = -1
    adj = torch.zeros(batch, nodes, nodes, dtype=torch.bool)
    b, child = (parent >= 0).nonzero(as_tuple=True)
    adj[b, child, parent[b, child]] = True
    adj[b, parent[b, child], child] = True
    return parent, adj


@lru_cache(maxsize=4)
def example_relations(batch: int) -> Tensor:
    """``(up, down)`` tree relations ``(batch, N, N, 2)`` of ``example_forest`` (computed once
    per batch size: the example inputs of ``tree`` and ``sipe``)."""
    _, up, down = tree_relations(example_forest(batch, DEFAULT_MAX_NODES, 0)[0])
    return torch.stack((up, down), dim=-1)


class GraphEncoding(Encoding):
    """Base of the graph encodings: node-id positions, a per-call structure tensor
    ``(B, N, N, ...)`` gathered at ``(q_pos[b, i], k_pos[b, j])``.

    Subclasses give ``structure(inputs) -> (B|1, N, N, ...)`` (checked inputs, see
    ``check_structure``) and ``bias`` reading ``pair``. ``precompute`` checks the graph
    count against the batch and the node ids against ``N`` and stores the expanded tensor
    (``GraphStructure``).

    Args:
        max_nodes: the largest node count a graph may have (positions are checked against
            it, like a learned table's ``max_positions``).
    """

    relative = False
    has_bias = True
    needs_inputs = True
    structure_input = ""  # the name of the precomputed structure in ``inputs``

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        max_nodes: Annotated[int, MAX_NODES] = DEFAULT_MAX_NODES,
    ):
        super().__init__(num_heads, head_dim)
        self.max_positions = max_nodes

    def structure(self, inputs: dict[str, Tensor]) -> Tensor:
        """The ``(B|1, N, N, ...)`` structure tensor of the call."""
        raise NotImplementedError

    def precompute(
        self, q: Tensor, k: Tensor, ctx: BiasContext, inputs: dict[str, Tensor]
    ) -> GraphStructure:
        s = self.structure(inputs)
        name = self.structure_input if self.structure_input in inputs else "adjacency"
        if s.shape[0] not in (1, q.shape[0]):
            raise ValueError(
                f"inputs[{name!r}] holds {s.shape[0]} graphs, expected 1 or the batch "
                f"size {q.shape[0]}"
            )
        top = largest_node_id(ctx)
        if top >= s.shape[1]:
            raise ValueError(
                f"positions are node ids: node {top} is outside inputs[{name!r}] with "
                f"{s.shape[1]} nodes"
            )
        return GraphStructure(s.expand(q.shape[0], *s.shape[1:]).to(q.device))

    def pair(self, ctx: BiasContext, b: Tensor, i: Tensor, j: Tensor) -> Tensor:
        """The structure entry of the node pair of (b, i, j)."""
        return ctx.data.structure[b, ctx.q_pos[b, i], ctx.k_pos[b, j]]

    @classmethod
    def example_inputs(cls, batch, length_q, length_k, generator):
        parent, adj = example_forest(batch, DEFAULT_MAX_NODES, 0)
        return {"adjacency": adj}
