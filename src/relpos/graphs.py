"""Graph and tree structure for graph positional encodings: pure functions on padded batches.

A batch of graphs is a dense adjacency ``(B, N, N)`` (bool or 0/1 float; padded nodes have no
edges) plus a node mask ``(B, N)``. Node ``n`` of graph ``b`` is the position ``n``: graph
encodings read ``q_pos`` / ``k_pos`` as node ids.

* ``adjacency_from_edges`` — padded adjacency + node mask from per-graph edge lists;
* ``shortest_path_distances`` — hop counts by breadth-first frontier expansion over the
  edge list (O(N * E) per hop), ``inf`` where unreachable;
* ``random_walk_probabilities`` — GRIT's RRWP ``[I, M, M^2, ..., M^(K-1)]`` with ``M = D^-1 A``;
* ``tree_relations`` — for trees/tries given by parent pointers: depths and, per pair, the
  steps up to the lowest common ancestor and down from it (ancestor/descendant distance).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .validation import check_bool, check_int


def adjacency_from_edges(
    edges: Sequence[Tensor | Sequence[tuple[int, int]]],
    num_nodes: Sequence[int],
    *,
    directed: bool = False,
) -> tuple[Tensor, Tensor]:
    """Dense padded adjacency ``(B, N, N)`` bool and node mask ``(B, N)`` from one edge list
    per graph (``(E, 2)`` tensor or list of ``(u, v)`` pairs) and the node counts. Undirected
    unless ``directed``."""
    if len(edges) != len(num_nodes):
        raise ValueError(
            f"edges and num_nodes must have one entry per graph, got {len(edges)} and "
            f"{len(num_nodes)}"
        )
    check_bool(directed, "directed")
    counts = [check_int(n, f"num_nodes[{b}]") for b, n in enumerate(num_nodes)]
    N = max(counts)
    adj = torch.zeros(len(counts), N, N, dtype=torch.bool)
    mask = torch.arange(N)[None, :] < torch.tensor(counts)[:, None]
    for b, (e, n) in enumerate(zip(edges, counts, strict=True)):
        e = torch.as_tensor(e, dtype=torch.long).reshape(-1, 2)
        if e.numel() and (int(e.min()) < 0 or int(e.max()) >= n):
            raise ValueError(f"edges of graph {b} must name nodes 0..{n - 1}")
        adj[b, e[:, 0], e[:, 1]] = True
        if not directed:
            adj[b, e[:, 1], e[:, 0]] = True
    return adj, mask


def check_adjacency(adjacency: object, name: str = "inputs['adjacency']") -> Tensor:
    """Validate a ``(B, N, N)`` adjacency (bool, or integer / floating 0/1 entries) and
    return it as bool. ``TypeError`` for a non-tensor or a complex one, ``ValueError`` naming
    ``name`` for a wrong shape, NaN / infinite entries or entries other than 0 and 1."""
    if not isinstance(adjacency, Tensor) or adjacency.is_complex():
        got = adjacency.dtype if isinstance(adjacency, Tensor) else type(adjacency).__name__
        raise TypeError(f"{name} must be a (B, N, N) bool or 0/1 tensor, got {got}")
    if adjacency.dim() != 3 or adjacency.shape[1] != adjacency.shape[2]:
        raise ValueError(
            f"{name} must be a square (B, N, N) bool or 0/1 tensor, got shape "
            f"{tuple(adjacency.shape)}"
        )
    if adjacency.dtype == torch.bool or adjacency.numel() == 0:
        return adjacency
    if adjacency.is_floating_point() and not bool(torch.isfinite(adjacency).all()):
        raise ValueError(f"{name} must be finite 0/1 entries (no NaN or inf)")
    if not bool(((adjacency == 0) | (adjacency == 1)).all()):
        raise ValueError(f"{name} must hold 0/1 entries (an unweighted graph)")
    return adjacency != 0


def shortest_path_distances(adjacency: Tensor) -> Tensor:
    """Hop counts ``(B, N, N)`` float32 (0 on the diagonal, ``inf`` where unreachable).

    Breadth-first from every node at once: the frontier of hop ``k`` is ``frontier_{k-1} @ A``
    minus what was reached: an ``index_add`` over the edge list per hop, O(N * E), up to the
    diameter."""
    adj = check_adjacency(adjacency, "adjacency")
    B, N, _ = adj.shape
    dist = torch.full((B, N, N), float("inf"), device=adj.device)
    for b in range(B):
        # next frontier[:, v] = any over edges (u, v) of frontier[:, u]: O(N * E) per hop
        src, dst = adj[b].nonzero(as_tuple=True)
        reached = torch.eye(N, dtype=torch.bool, device=adj.device)
        frontier = reached.clone()
        dist[b][reached] = 0.0
        for hop in range(1, N):
            spread = torch.zeros(N, N, device=adj.device).index_add_(
                1, dst, frontier[:, src].float()
            )
            frontier = (spread > 0) & ~reached
            if not bool(frontier.any()):
                break
            dist[b][frontier] = float(hop)
            reached |= frontier
    return dist


def random_walk_probabilities(
    adjacency: Tensor, steps: int, *, add_identity: bool = True
) -> Tensor:
    """GRIT's relative random-walk probabilities ``(B, N, N, K)``: channel ``k`` is
    ``M^k`` (``M = D^-1 A``, isolated nodes give a zero row), ``k = 0..K-1`` with the identity
    first when ``add_identity`` (else ``M^1..M^K``)."""
    check_int(steps, "steps")
    check_bool(add_identity, "add_identity")
    adj = check_adjacency(adjacency, "adjacency").float()
    B, N, _ = adj.shape
    deg = adj.sum(-1, keepdim=True)
    M = torch.where(deg > 0, adj / deg.clamp_min(1), torch.zeros_like(adj))
    power = torch.eye(N, device=adj.device).expand(B, N, N)
    out = []
    if not add_identity:
        power = M
    for _ in range(steps):
        out.append(power)
        power = torch.bmm(power, M)
    return torch.stack(out, dim=-1)


def tree_relations(parent: Tensor, name: str = "parent") -> tuple[Tensor, Tensor, Tensor]:
    """Depths and lowest-common-ancestor steps of trees given by parent pointers.

    ``parent (B, N)`` int: the parent node of each node, ``-1`` for roots (padding nodes may
    be roots). Returns ``depth (B, N)``, ``up (B, N, N)`` = steps from ``i`` up to the lowest
    common ancestor of ``i`` and ``j``, ``down (B, N, N)`` = steps from it down to ``j``
    (``up == 0``: ``i`` is an ancestor of ``j``; ``down == 0``: a descendant). Nodes in
    different trees get ``-1`` in both. Errors name the input as ``name``."""
    integer = isinstance(parent, Tensor) and not (
        parent.is_floating_point() or parent.is_complex() or parent.dtype == torch.bool
    )
    if not integer:
        got = parent.dtype if isinstance(parent, Tensor) else type(parent).__name__
        raise TypeError(f"{name} must be an integer (B, N) tensor of parent ids, got {got}")
    if parent.dim() != 2:
        raise ValueError(f"{name} must have shape (B, N), got {tuple(parent.shape)}")
    B, N = parent.shape
    if parent.numel() and (int(parent.min()) < -1 or int(parent.max()) >= N):
        raise ValueError(f"{name} entries must be -1 (root) or a node index 0..{N - 1}")
    par = parent.long()
    # ancestors[b, n, s] = the ancestor of n that is s steps up (n itself at s = 0), -1 above
    # the root; depth = number of steps to the root
    idx = torch.arange(N, device=parent.device).expand(B, N)
    chain = [idx]
    for _ in range(N):
        prev = chain[-1]
        nxt = torch.where(prev >= 0, par.gather(1, prev.clamp_min(0)), prev)
        if bool((nxt < 0).all()):
            break
        chain.append(nxt)
    else:
        raise ValueError(f"{name}: the parent pointers contain a cycle")
    anc = torch.stack(chain, dim=-1)  # (B, N, S)
    depth = (anc >= 0).sum(-1) - 1
    # ancestor of every node at each absolute depth d (root at depth 0): anc[depth - d]
    S = anc.shape[-1]
    d = torch.arange(S, device=parent.device)
    steps = depth[..., None] - d  # (B, N, S) steps up to reach depth d
    at_depth = torch.where(
        steps >= 0, anc.gather(2, steps.clamp(0, S - 1)), torch.full_like(steps, -1)
    )
    same = (at_depth[:, :, None, :] == at_depth[:, None, :, :]) & (at_depth[:, :, None, :] >= 0)
    lca_depth = torch.where(same, d, -1).amax(-1)  # (B, N, N)
    up = torch.where(lca_depth >= 0, depth[:, :, None] - lca_depth, -1)
    down = torch.where(lca_depth >= 0, depth[:, None, :] - lca_depth, -1)
    return depth, up, down
