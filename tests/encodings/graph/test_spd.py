"""Shortest-path ALiBi (``graph-spd``): ALiBi slopes times hop counts on a path graph, and the
policies for unreachable pairs."""

from __future__ import annotations

import torch

import relpos
from relpos.graphs import adjacency_from_edges

from ._graphs import path_adjacency


def test_spec_17_path_graph_head0():
    enc = relpos.create("graph-spd", num_heads=4, head_dim=8)
    q = torch.zeros(1, 4, 4, 8)
    s = relpos.scores(q, q, enc, inputs={"adjacency": path_adjacency(4)})
    expected = -0.25 * (torch.arange(4)[:, None] - torch.arange(4)[None]).abs().float()
    torch.testing.assert_close(s[0, 0], expected)
    torch.testing.assert_close(s[0, 1], expected / 4)  # slope 0.0625


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
