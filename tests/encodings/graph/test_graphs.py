"""``relpos.graphs``: structures against networkx (shortest paths, lowest common ancestors)
and GRIT's RRWP (LiamMa/GRIT) on a path of three, and their input checks."""

from __future__ import annotations

import math

import pytest
import torch

from relpos.graphs import (
    adjacency_from_edges,
    random_walk_probabilities,
    shortest_path_distances,
    tree_relations,
)

from ._graphs import path_adjacency, random_graphs

nx = pytest.importorskip("networkx")


def test_spec_18_rrwp_path_of_three():
    P = random_walk_probabilities(path_adjacency(3), 3)[0]
    M = torch.tensor([[0, 1, 0], [0.5, 0, 0.5], [0, 1, 0]])
    torch.testing.assert_close(P[..., 0], torch.eye(3))
    torch.testing.assert_close(P[..., 1], M)
    torch.testing.assert_close(P[..., 2], torch.tensor([[0.5, 0, 0.5], [0, 1, 0], [0.5, 0, 0.5]]))
    node_pe = torch.diagonal(P, dim1=0, dim2=1).T  # P_ii per node
    torch.testing.assert_close(node_pe, torch.tensor([[1, 0, 0.5], [1, 0, 1], [1, 0, 0.5]]))


@pytest.mark.parametrize("seed", range(4))
def test_shortest_paths_match_networkx(seed):
    edges, graphs, sizes = random_graphs(seed)
    adj, mask = adjacency_from_edges(edges, sizes)
    assert mask.sum(1).tolist() == sizes
    spd = shortest_path_distances(adj)
    for b, g in enumerate(graphs):
        lengths = dict(nx.all_pairs_shortest_path_length(g))
        n = sizes[b]
        ref = torch.tensor(
            [[float(lengths[i].get(j, float("inf"))) for j in range(n)] for i in range(n)]
        )
        assert torch.equal(spd[b, :n, :n], ref)


@pytest.mark.parametrize("seed", range(3))
def test_tree_relations_match_networkx_lca(seed):
    gen = torch.Generator().manual_seed(seed)
    n = 25
    parent = torch.cat(
        [torch.tensor([-1]), (torch.rand(n - 1, generator=gen) * torch.arange(1, n)).long()]
    )
    parent[17] = -1  # a second tree
    depth, up, down = tree_relations(parent[None])
    g = nx.DiGraph([(int(parent[c]), c) for c in range(n) if parent[c] >= 0])
    g.add_nodes_from(range(n))
    roots = [r for r in range(n) if parent[r] < 0]
    tree_of = {v: r for r in roots for v in [r, *nx.descendants(g, r)]}
    for i in range(n):
        root = tree_of[i]
        assert int(depth[0, i]) == nx.shortest_path_length(g, root, i)
        for j in range(n):
            if tree_of[j] != root:
                assert int(up[0, i, j]) == -1 and int(down[0, i, j]) == -1
                continue
            a = nx.lowest_common_ancestor(g, i, j)
            assert int(up[0, i, j]) == int(depth[0, i]) - int(depth[0, a])
            assert int(down[0, i, j]) == int(depth[0, j]) - int(depth[0, a])


def test_graphs_functions_reject_cycles_and_out_of_range_edges():
    with pytest.raises(ValueError, match="cycle"):
        tree_relations(torch.tensor([[1, 0]]))
    with pytest.raises(ValueError, match="edges of graph 0"):
        adjacency_from_edges([[(0, 5)]], [3])


def test_graphs_functions_follow_the_validation_policy():
    with pytest.raises(ValueError, match=r"num_nodes\[1\]"):
        adjacency_from_edges([[], []], [3, 0])
    with pytest.raises(TypeError, match=r"num_nodes\[0\]"):
        adjacency_from_edges([[(0, 1)]], [2.5])  # used to be truncated to 2 silently
    with pytest.raises(TypeError, match="directed"):
        adjacency_from_edges([[(0, 1)]], [2], directed="yes")
    with pytest.raises(ValueError, match="steps"):
        random_walk_probabilities(path_adjacency(3), 0)
    with pytest.raises(TypeError, match="adjacency"):
        shortest_path_distances([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match="adjacency.*NaN"):
        shortest_path_distances(torch.full((1, 2, 2), math.nan))
    with pytest.raises(TypeError, match="parent"):
        tree_relations(torch.tensor([[-1.0, 0.0]]))
