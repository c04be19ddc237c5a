"""``GraphEncoding``: precomputed structures equal the adjacency they come from, and bad
inputs are refused with errors that name them."""

from __future__ import annotations

import math

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


NAN_ADJACENCY = path_adjacency(5).float().masked_fill(torch.eye(5, dtype=torch.bool), math.nan)


@pytest.mark.parametrize("name", ["graph-spd", "grit-rrwp"])
@pytest.mark.parametrize(
    ("adjacency", "exc", "match"),
    [
        (NAN_ADJACENCY, ValueError, r"inputs\['adjacency'\].*(NaN|finite)"),
        (path_adjacency(5).float() * math.inf, ValueError, r"inputs\['adjacency'\]"),
        (path_adjacency(5).float() * 0.5, ValueError, r"inputs\['adjacency'\].*0/1"),
        (torch.zeros(5, 5), ValueError, r"inputs\['adjacency'\].*\(B, N, N\)"),
        (torch.zeros(1, 5, 5, 1), ValueError, r"inputs\['adjacency'\]"),
        ([[0, 1], [1, 0]], TypeError, r"inputs\['adjacency'\]"),
    ],
    ids=["nan", "inf", "weighted", "2d", "4d", "list"],
)
def test_bad_adjacencies_are_refused_naming_the_input(name, adjacency, exc, match):
    # regression: NaN adjacencies used to count as edges (NaN != 0) and give finite scores
    enc = relpos.create(name, num_heads=1, head_dim=8)
    q = torch.zeros(1, 1, 5, 8)
    with pytest.raises(exc, match=match):
        relpos.scores(q, q, enc, inputs={"adjacency": adjacency})


def test_bad_precomputed_structures_are_refused_naming_the_input():
    q = torch.zeros(1, 1, 5, 8)
    spd = relpos.create("graph-spd", num_heads=1, head_dim=8)
    hops = shortest_path_distances(path_adjacency(5))
    for bad, match in [
        (hops.masked_fill(torch.eye(5, dtype=torch.bool), math.nan), "NaN"),
        (-hops, ">= 0"),
        (hops[0], r"\(B, N, N\)"),
    ]:
        with pytest.raises(ValueError, match=rf"inputs\['spd'\].*{match}"):
            relpos.scores(q, q, spd, inputs={"spd": bad})
    # inf means "unreachable": allowed
    assert torch.isfinite(relpos.scores(q, q, spd, inputs={"spd": hops})).all()
    rrwp = relpos.create("grit-rrwp", num_heads=1, head_dim=8, steps=4)
    walks = random_walk_probabilities(path_adjacency(5), 4)
    with pytest.raises(ValueError, match=r"inputs\['rrwp'\].*\(B, N, N, 4\)"):
        relpos.scores(q, q, rrwp, inputs={"rrwp": walks[..., :3]})
    with pytest.raises(ValueError, match=r"inputs\['rrwp'\].*finite"):
        relpos.scores(q, q, rrwp, inputs={"rrwp": walks + math.inf})
    tree = relpos.create("tree", num_heads=1, head_dim=8)
    with pytest.raises(TypeError, match=r"inputs\['relations'\].*integer"):
        relpos.scores(q, q, tree, inputs={"relations": torch.zeros(1, 5, 5, 2)})
    with pytest.raises(ValueError, match=r"inputs\['relations'\].*>= -1"):
        relpos.scores(q, q, tree, inputs={"relations": torch.full((1, 5, 5, 2), -2)})
    with pytest.raises(TypeError, match=r"inputs\['parent'\].*integer"):
        relpos.scores(q, q, tree, inputs={"parent": torch.tensor([[-1.0, 0, 0, 1, 1]])})
    with pytest.raises(ValueError, match=r"inputs\['parent'\].*\(B, N\)"):
        relpos.scores(q, q, tree, inputs={"parent": torch.tensor([-1, 0, 0, 1, 1])})


def test_zero_one_float_and_integer_adjacencies_equal_the_bool_one():
    enc = relpos.create("graph-spd", num_heads=2, head_dim=8)
    q = torch.randn(1, 2, 5, 8, generator=torch.Generator().manual_seed(0))
    adj = path_adjacency(5)
    ref = relpos.scores(q, q, enc, inputs={"adjacency": adj})
    for other in (adj.float(), adj.long(), adj.double()):
        assert torch.equal(relpos.scores(q, q, enc, inputs={"adjacency": other}), ref)
