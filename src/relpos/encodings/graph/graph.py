"""Graph and tree encodings: biases from shortest paths, random walks and tree relations.

Positions are node ids: query ``i`` is node ``q_pos[b, i]`` of graph ``b`` and key ``j`` is
node ``k_pos[b, j]`` (default ``0..N-1``: every node attends to every node). The structure
comes per call as ``relpos.attention(..., inputs={"adjacency": (B, N, N)})`` (dense, bool or
0/1; padded nodes have no edges, mask them with ``mask``) or, computed once per graph and
reused by every layer, as the derived tensor (``"spd"``, ``"rrwp"``). ``relpos.graphs`` builds
padded adjacencies from edge lists and computes the structures.

The structural tensors are ``(B, N, N[, K])``: a graph bias is a function of the node pair,
not of a distance, so it has no O(L) form; the backends still never build anything larger
than a ``(B, H, T, S)`` tile from them.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor, nn

from ...functional import alibi_slopes
from ...graphs import (
    random_walk_probabilities,
    shortest_path_distances,
    tree_relations,
)
from ...registry import register
from ..base import BiasContext, Encoding

DEFAULT_MAX_NODES = 1024


@lru_cache(maxsize=8)
def _example_forest(batch: int, nodes: int, seed: int) -> tuple[Tensor, Tensor]:
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


class GraphEncoding(Encoding):
    """Base of the graph encodings: node-id positions, a per-call structure tensor
    ``(B, N, N, ...)`` gathered at ``(q_pos[b, i], k_pos[b, j])``.

    Args:
        max_nodes: the largest node count a graph may have (positions are checked against
            it, like a learned table's ``max_positions``).
    """

    family = "graph"
    relative = False
    has_bias = True
    needs_inputs = True
    structure_input = ""  # the name of the precomputed structure in ``inputs``

    def __init__(self, num_heads: int, head_dim: int, *, max_nodes: int = DEFAULT_MAX_NODES):
        super().__init__(num_heads, head_dim)
        if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1:
            raise ValueError(f"max_nodes must be a positive int, got {max_nodes!r}")
        self.max_positions = max_nodes

    def structure(self, inputs: dict[str, Tensor]) -> Tensor:
        """The ``(B|1, N, N, ...)`` structure tensor of the call."""
        raise NotImplementedError

    def prepare(self, q, k, q_pos, k_pos, inputs=None) -> BiasContext:
        ctx = super().prepare(q, k, q_pos, k_pos, inputs)
        inputs = inputs or {}
        s = self.structure(inputs)
        name = self.structure_input if self.structure_input in inputs else "adjacency"
        if s.shape[0] not in (1, q.shape[0]):
            raise ValueError(
                f"inputs[{name!r}] holds {s.shape[0]} graphs, expected 1 or the batch "
                f"size {q.shape[0]}"
            )
        top = int(max(ctx.q_pos.max(), ctx.k_pos.max())) if ctx.q_pos.numel() else 0
        if top >= s.shape[1]:
            raise ValueError(
                f"positions are node ids: node {top} is outside inputs[{name!r}] with "
                f"{s.shape[1]} nodes"
            )
        ctx.extra["structure"] = s.expand(q.shape[0], *s.shape[1:]).to(q.device)
        return ctx

    def pair(self, ctx: BiasContext, b: Tensor, i: Tensor, j: Tensor) -> Tensor:
        """The structure entry of the node pair of (b, i, j)."""
        return ctx.extra["structure"][b, ctx.q_pos[b, i], ctx.k_pos[b, j]]

    @classmethod
    def example_inputs(cls, batch, length_q, length_k, generator):
        parent, adj = _example_forest(batch, DEFAULT_MAX_NODES, 0)
        return {"adjacency": adj}


def _structure_or(inputs: dict[str, Tensor], name: str, form: str, compute) -> Tensor:
    if name in inputs:
        t = inputs[name]
        if t.dim() < 3 or t.shape[1] != t.shape[2]:
            raise ValueError(f"inputs[{name!r}] must have shape {form}, got {tuple(t.shape)}")
        return t
    if "adjacency" not in inputs:
        raise ValueError(f"pass inputs={{'adjacency': (B, N, N)}} or the precomputed {name!r}")
    return compute(inputs["adjacency"])


@register("graph-spd")
class ShortestPathALiBi(GraphEncoding):
    """ALiBi over shortest-path distances (Gurev & Rumbell 2025, arXiv 2506.19834;
    Authority C: abstract only).

    ``b_h(i, j) = -m_h * SPD(i, j)`` with the ALiBi slopes ``m_h`` (``alibi_slopes``),
    symmetric, no causal mask. Assumed where the paper is silent: ``max_spd`` caps distances
    (None: no cap); unreachable pairs (different components) get ``unreachable``: ``"cap"``
    = the distance ``max_spd + 1`` (or the node count N without a cap), ``"mask"`` = no
    attention (-inf; a node always reaches itself, so no row is empty), or a number =
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
        max_spd: int | None = None,
        unreachable: str | float = "cap",
        max_nodes: int = DEFAULT_MAX_NODES,
    ) -> None:
        super().__init__(num_heads, head_dim, max_nodes=max_nodes)
        if max_spd is not None and (not isinstance(max_spd, int) or max_spd < 0):
            raise ValueError(f"max_spd must be a non-negative int or None, got {max_spd!r}")
        if not (unreachable in ("cap", "mask") or isinstance(unreachable, (int, float))):
            raise ValueError(f"unreachable must be 'cap', 'mask' or a number, got {unreachable!r}")
        self.max_spd = max_spd
        self.unreachable = unreachable
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    def structure(self, inputs):
        spd = _structure_or(inputs, "spd", "(B, N, N)", shortest_path_distances).float()
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
    return shortest_path_distances(_example_forest(batch, DEFAULT_MAX_NODES, 0)[1])


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
    ``rrwp (B, N, N, K)``.
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
        steps: int = 8,
        values: bool = False,
        max_nodes: int = DEFAULT_MAX_NODES,
    ) -> None:
        super().__init__(num_heads, head_dim, max_nodes=max_nodes)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be a positive int, got {steps!r}")
        self.steps = steps
        self.weight = nn.Parameter(nn.init.xavier_uniform_(torch.empty(num_heads, steps)))
        self.has_value_term = bool(values)
        if values:
            w = torch.empty(num_heads, steps, head_dim)
            self.value_weight = nn.Parameter(nn.init.xavier_normal_(w))

    def structure(self, inputs):
        rrwp = _structure_or(
            inputs,
            "rrwp",
            "(B, N, N, K)",
            lambda a: random_walk_probabilities(a, self.steps),
        )
        if rrwp.dim() != 4 or rrwp.shape[-1] != self.steps:
            raise ValueError(
                f"inputs['rrwp'] must have shape (B, N, N, {self.steps}), got {tuple(rrwp.shape)}"
            )
        return rrwp.float()

    def bias(self, ctx, b, h, i, j):
        s = ctx.extra["structure"]
        qn, kn = ctx.q_pos[b, i], ctx.k_pos[b, j]
        out = s[b, qn, kn, 0] * self.weight[h, 0]
        for step in range(1, self.steps):  # element-wise (a FlexAttention score_mod)
            out = out + s[b, qn, kn, step] * self.weight[h, step]
        return out

    def value_term(self, ctx, p, b, h, i, j):
        s = ctx.extra["structure"]
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
    return random_walk_probabilities(_example_forest(batch, DEFAULT_MAX_NODES, 0)[1], steps)


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
    ``parent (B, N)`` int parent pointers (-1 = root).
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
        max_up: int = 8,
        max_down: int = 8,
        max_nodes: int = DEFAULT_MAX_NODES,
    ) -> None:
        super().__init__(num_heads, head_dim, max_nodes=max_nodes)
        for arg, v in (("max_up", max_up), ("max_down", max_down)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{arg} must be a non-negative int, got {v!r}")
        self.max_up, self.max_down = max_up, max_down
        self.table = nn.Parameter(torch.zeros((max_up + 1) * (max_down + 1) + 1, num_heads))

    def structure(self, inputs):
        if "relations" in inputs:
            rel = inputs["relations"]
            if rel.dim() != 4 or rel.shape[-1] != 2 or rel.shape[1] != rel.shape[2]:
                raise ValueError(
                    f"inputs['relations'] must have shape (B, N, N, 2), got {tuple(rel.shape)}"
                )
            up, down = rel[..., 0].long(), rel[..., 1].long()
        elif "parent" in inputs:
            _, up, down = tree_relations(inputs["parent"])
        else:
            raise ValueError("pass inputs={'parent': (B, N)} or the precomputed 'relations'")
        index = up.clamp(max=self.max_up) * (self.max_down + 1) + down.clamp(max=self.max_down)
        return torch.where(up < 0, self.table.shape[0] - 1, index)

    def bias(self, ctx, b, h, i, j):
        return self.table[self.pair(ctx, b, i, j), h]

    @classmethod
    def example_inputs(cls, batch, length_q, length_k, generator):
        return {"relations": _example_relations(batch)}


@lru_cache(maxsize=4)
def _example_relations(batch: int) -> Tensor:
    _, up, down = tree_relations(_example_forest(batch, DEFAULT_MAX_NODES, 0)[0])
    return torch.stack((up, down), dim=-1)


__all__ = ["GraphEncoding", "ShortestPathALiBi", "RandomWalkPairEncoding", "TreeRelationBias"]
