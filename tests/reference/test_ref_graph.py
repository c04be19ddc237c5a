"""Graph and tree encodings: spec values (§17 shortest-path ALiBi, §18 GRIT RRWP), structures
against networkx, unreachable-pair policies, GRIT's value term against a dense reference."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.graphs import (
    adjacency_from_edges,
    random_walk_probabilities,
    shortest_path_distances,
    tree_relations,
)

nx = pytest.importorskip("networkx")


def _path(n: int) -> torch.Tensor:
    adj, _ = adjacency_from_edges([[(i, i + 1) for i in range(n - 1)]], [n])
    return adj


def test_spec_17_path_graph_head0():
    enc = relpos.create("graph-spd", num_heads=4, head_dim=8)
    q = torch.zeros(1, 4, 4, 8)
    s = relpos.scores(q, q, enc, inputs={"adjacency": _path(4)})
    expected = -0.25 * (torch.arange(4)[:, None] - torch.arange(4)[None]).abs().float()
    torch.testing.assert_close(s[0, 0], expected)
    torch.testing.assert_close(s[0, 1], expected / 4)  # slope 0.0625


def test_spec_18_rrwp_path_of_three():
    P = random_walk_probabilities(_path(3), 3)[0]
    M = torch.tensor([[0, 1, 0], [0.5, 0, 0.5], [0, 1, 0]])
    torch.testing.assert_close(P[..., 0], torch.eye(3))
    torch.testing.assert_close(P[..., 1], M)
    torch.testing.assert_close(P[..., 2], torch.tensor([[0.5, 0, 0.5], [0, 1, 0], [0.5, 0, 0.5]]))
    node_pe = torch.diagonal(P, dim1=0, dim2=1).T  # P_ii per node
    torch.testing.assert_close(node_pe, torch.tensor([[1, 0, 0.5], [1, 0, 1], [1, 0, 0.5]]))


def _random_graphs(seed: int, sizes=(9, 14)):
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


@pytest.mark.parametrize("seed", range(4))
def test_shortest_paths_match_networkx(seed):
    edges, graphs, sizes = _random_graphs(seed)
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


def test_unreachable_policies():
    adj, _ = adjacency_from_edges([[(0, 1)]], [3])  # node 2 isolated
    q = torch.zeros(1, 1, 3, 8)
    cap = relpos.scores(q, q, relpos.create("graph-spd", num_heads=1, head_dim=8),
                        inputs={"adjacency": adj})  # fmt: skip
    slope = float(relpos.functional.alibi_slopes(1)[0])  # 2^-8
    assert float(cap[0, 0, 0, 2]) == -slope * 3  # unreachable: the node count N
    capped = relpos.create("graph-spd", num_heads=1, head_dim=8, max_spd=1)
    s = relpos.scores(q, q, capped, inputs={"adjacency": adj})
    assert float(s[0, 0, 0, 2]) == -slope * 2  # max_spd + 1
    masked = relpos.create("graph-spd", num_heads=1, head_dim=8, unreachable="mask")
    s = relpos.scores(q, q, masked, inputs={"adjacency": adj})
    assert s[0, 0, 0, 2] == float("-inf") and torch.isfinite(s[0, 0, 2, 2])
    v = torch.randn(1, 1, 3, 8)
    out = relpos.attention(q, q, v, masked, inputs={"adjacency": adj})
    torch.testing.assert_close(out[0, 0, 2], v[0, 0, 2])  # the isolated node sees itself only


def test_precomputed_structures_equal_adjacency():
    edges, _, sizes = _random_graphs(7)
    adj, mask = adjacency_from_edges(edges, sizes)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 14, 8, generator=gen) for _ in range(3))
    m = mask[:, None, None, :]
    for name, key, pre in (
        ("graph-spd", "spd", shortest_path_distances(adj)),
        ("grit-rrwp", "rrwp", random_walk_probabilities(adj, 8)),
    ):
        torch.manual_seed(0)
        enc = relpos.create(name, num_heads=2, head_dim=8)
        a = relpos.attention(q, k, v, enc, mask=m, inputs={"adjacency": adj})
        b = relpos.attention(q, k, v, enc, mask=m, inputs={key: pre})
        torch.testing.assert_close(a, b)


def test_grit_value_term_matches_dense_reference():
    edges, _, sizes = _random_graphs(3, sizes=(12, 12))
    adj, _ = adjacency_from_edges(edges, sizes)
    torch.manual_seed(0)
    enc = relpos.create("grit-rrwp", num_heads=2, head_dim=8, steps=4, values=True)
    P = random_walk_probabilities(adj, 4)  # (B, N, N, K)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 12, 8, generator=gen, requires_grad=True) for _ in range(3))
    logits = q @ k.transpose(-1, -2) / 8**0.5 + torch.einsum("bijk,hk->bhij", P, enc.weight)
    p = logits.softmax(-1)
    ref = p @ v + torch.einsum("bhij,bijk,hkd->bhid", p, P, enc.value_weight)
    for backend in ("eager", "chunked"):
        out = relpos.attention(q, k, v, enc, inputs={"adjacency": adj}, backend=backend)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        g = torch.autograd.grad(out.square().sum(), (q, enc.value_weight, enc.weight))
        r = torch.autograd.grad(
            ref.square().sum(), (q, enc.value_weight, enc.weight), retain_graph=True
        )
        for a, b in zip(g, r, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_tree_bias_reads_the_up_down_table():
    parent = torch.tensor([[-1, 0, 0, 1]])  # 0 -> {1, 2}, 1 -> 3
    enc = relpos.create("tree", num_heads=1, head_dim=8, max_up=1, max_down=2)
    with torch.no_grad():
        enc.table.copy_(torch.arange(enc.table.numel(), dtype=torch.float32)[:, None])
    q = torch.zeros(1, 1, 4, 8)
    s = relpos.scores(q, q, enc, inputs={"parent": parent})[0, 0].detach()
    # pair (3, 2): up 2 (clipped to 1), down 1 -> 1 * 3 + 1 = 4; pair (0, 3): up 0, down 2 -> 2
    assert float(s[3, 2]) == 4.0 and float(s[0, 3]) == 2.0 and float(s[2, 2]) == 0.0


def test_graph_input_errors():
    enc = relpos.create("graph-spd", num_heads=1, head_dim=8)
    q = torch.zeros(2, 1, 5, 8)
    with pytest.raises(ValueError, match="inputs"):
        relpos.attention(q, q, q, enc)
    with pytest.raises(ValueError, match="node 4"):
        relpos.attention(q, q, q, enc, inputs={"adjacency": _path(3).expand(2, 3, 3)})
    with pytest.raises(ValueError, match="square"):
        relpos.attention(q, q, q, enc, inputs={"adjacency": torch.zeros(2, 5, 4)})
    with pytest.raises(ValueError, match="graphs"):
        relpos.attention(q, q, q, enc, inputs={"adjacency": _path(5).expand(3, 5, 5)})
    with pytest.raises(ValueError, match="does not read"):
        relpos.attention(q, q, q, enc, inputs={"boxes": torch.zeros(2, 5, 4)})
    with pytest.raises(ValueError, match="cycle"):
        tree_relations(torch.tensor([[1, 0]]))
    with pytest.raises(ValueError, match="edges of graph 0"):
        adjacency_from_edges([[(0, 5)]], [3])
