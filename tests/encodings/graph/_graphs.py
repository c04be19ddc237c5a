"""Small graphs for the graph tests: a path, and random graphs with their networkx twins."""

from __future__ import annotations

import pytest
import torch

from relpos.graphs import adjacency_from_edges


def path_adjacency(n: int) -> torch.Tensor:
    """The path 0 - 1 - ... - (n - 1) as a (1, n, n) bool adjacency."""
    adj, _ = adjacency_from_edges([[(i, i + 1) for i in range(n - 1)]], [n])
    return adj


def random_graphs(seed: int, sizes=(9, 14)):
    """Random edge lists of graphs of ``sizes`` nodes, their networkx graphs and the sizes
    (skips the test without networkx)."""
    nx = pytest.importorskip("networkx")
    gen = torch.Generator().manual_seed(seed)
    edges, graphs = [], []
    for n in sizes:
        e = [(int(u), int(v)) for u, v in torch.randint(0, n, (n, 2), generator=gen) if u != v]
        edges.append(e)
        g = nx.Graph()
        g.add_nodes_from(range(n))
        g.add_edges_from(e)
        graphs.append(g)
    return edges, graphs, list(sizes)
