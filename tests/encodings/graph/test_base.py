"""``GraphEncoding``: precomputed structures equal the adjacency they come from, and bad
inputs are refused with errors that name them."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.graphs import adjacency_from_edges, random_walk_probabilities, shortest_path_distances

from ._graphs import path_adjacency, random_graphs


def test_precomputed_structures_equal_adjacency():
    edges, _, sizes = random_graphs(7)
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


def test_graph_input_errors():
    enc = relpos.create("graph-spd", num_heads=1, head_dim=8)
    q = torch.zeros(2, 1, 5, 8)
    with pytest.raises(ValueError, match="inputs"):
        relpos.attention(q, q, q, enc)
    with pytest.raises(ValueError, match="node 4"):
        relpos.attention(q, q, q, enc, inputs={"adjacency": path_adjacency(3).expand(2, 3, 3)})
    with pytest.raises(ValueError, match="square"):
        relpos.attention(q, q, q, enc, inputs={"adjacency": torch.zeros(2, 5, 4)})
    with pytest.raises(ValueError, match="graphs"):
        relpos.attention(q, q, q, enc, inputs={"adjacency": path_adjacency(5).expand(3, 5, 5)})
    with pytest.raises(ValueError, match="does not read"):
        relpos.attention(q, q, q, enc, inputs={"boxes": torch.zeros(2, 5, 4)})
