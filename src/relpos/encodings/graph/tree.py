"""Tree / trie relations: a learned per-head bias over (steps up to the lowest common
ancestor, steps down from it) of two nodes of a tree.

Inputs: ``parent (B, N)`` parent pointers or the precomputed ``relations (B, N, N, 2)``
(``relpos.graphs.tree_relations``).
"""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor, nn

from ...graphs import tree_relations
from ..options import Int
from ..registry import register
from .base import DEFAULT_MAX_NODES, MAX_NODES, GraphEncoding, check_structure, example_relations

__all__ = ["TreeRelationBias"]


def check_relations(value: object) -> Tensor:
    """``inputs['relations']``: ``(B, N, N, 2)`` integer ``(up, down)`` steps, ``-1`` for
    nodes of different trees."""
    return check_structure(
        value, "relations", "(B, N, N, 2)", dims=4, last=2, integer=True, minimum=-1
    )


@register("tree")
class TreeRelationBias(GraphEncoding):
    """Tree / trie relations: a learned per-head bias over (steps up to the lowest common
    ancestor, steps down from it), clipped at ``max_up`` / ``max_down``.

    For nodes ``i, j`` of a tree with lowest common ancestor ``a``: ``up = depth(i) -
    depth(a)``, ``down = depth(j) - depth(a)``; ``up == 0`` means ``i`` is an ancestor of
    ``j`` (``down`` = how far below), ``down == 0`` a descendant. The table ``(max_up + 1,
    max_down + 1, H)`` (zero-initialised) has one extra entry for nodes of different trees.
    This is the relation set of tree-structured Transformers (e.g. Shiv & Quirk 2019's
    path-based positions, trie attention); the table form is ours. Inputs:
    ``parent (B, N)`` int parent pointers (-1 = root) or the precomputed ``relations``.
    """

    paper = "tree / trie relations (ancestor-descendant distances)"
    structure_input = "relations"
    optional_inputs = {
        "parent": "(B, N) int parent pointers, -1 for roots",
        "relations": "(B, N, N, 2) int (up, down) from relpos.graphs.tree_relations",
    }

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        max_up: Annotated[int, Int(minimum=0, doc="steps up to the common ancestor, clipped")] = 8,
        max_down: Annotated[int, Int(minimum=0, doc="steps down from it, clipped")] = 8,
        max_nodes: Annotated[int, MAX_NODES] = DEFAULT_MAX_NODES,
    ) -> None:
        super().__init__(num_heads, head_dim, max_nodes=max_nodes)
        self.max_up, self.max_down = max_up, max_down
        self.table = nn.Parameter(torch.zeros((max_up + 1) * (max_down + 1) + 1, num_heads))

    def structure(self, inputs):
        if "relations" in inputs:
            rel = check_relations(inputs["relations"])
            up, down = rel[..., 0].long(), rel[..., 1].long()
        elif "parent" in inputs:
            _, up, down = tree_relations(inputs["parent"], "inputs['parent']")
        else:
            raise ValueError("pass inputs={'parent': (B, N)} or the precomputed 'relations'")
        index = up.clamp(max=self.max_up) * (self.max_down + 1) + down.clamp(max=self.max_down)
        return torch.where(up < 0, self.table.shape[0] - 1, index)

    def bias(self, ctx, b, h, i, j):
        return self.table[self.pair(ctx, b, i, j), h]

    @classmethod
    def example_inputs(cls, batch, length_q, length_k, generator):
        return {"relations": example_relations(batch)}
