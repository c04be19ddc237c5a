"""Reading-order codes on a word graph (Lee et al. 2021, arXiv 2106.10786; a reconstruction from
the abstract): worked codes, their invariance to inserted non-neighbours, and the bias."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.encodings.graph.reading_order import NO_EDGE, reading_order_codes


def star(n: int, centre: int, neighbours: list[int]) -> torch.Tensor:
    adj = torch.zeros(1, n, n, dtype=torch.bool)
    for u in neighbours:
        adj[0, centre, u] = adj[0, u, centre] = True
    return adj


def test_spec_codes_of_target_3_with_neighbours_1_4_5():
    adj = star(7, 3, [1, 4, 5])
    codes = reading_order_codes(adj, torch.arange(7)[None])[0, 3]
    assert {u: int(codes[u]) for u in (1, 3, 4, 5)} == {1: -1, 3: 0, 4: 1, 5: 2}
    assert all(int(codes[u]) == NO_EDGE for u in (0, 2, 6))


def test_inserting_non_neighbour_words_leaves_the_codes_unchanged():
    adj = star(7, 3, [1, 4, 5])
    base = reading_order_codes(adj, torch.arange(7)[None])[0, 3]
    # the same graph with four extra unconnected words read between the neighbours
    big = torch.zeros(1, 11, 11, dtype=torch.bool)
    big[0, :7, :7] = adj[0]
    order = torch.tensor([[0, 2, 4, 5, 8, 9, 10, 1, 3, 6, 7]])  # extras read at 1, 3, 6, 7
    codes = reading_order_codes(big, order)[0, 3, :7]
    assert torch.equal(codes, base)
    # the index gap changed (5 - 3 = 2 before, 9 - 5 = 4 now), the code did not
    assert int(order[0, 5] - order[0, 3]) == 4 and int(codes[5]) == 2


def test_bias_reads_the_table_on_edges_and_masks_the_rest():
    enc = relpos.create("reading-order", num_heads=2, head_dim=4, max_code=1)
    with torch.no_grad():
        enc.table.copy_(torch.tensor([[-1.0, 0.0, 1.0], [10.0, 20.0, 30.0]]))
    adj = star(7, 3, [1, 4, 5])
    inputs = {"adjacency": adj, "reading_order": torch.arange(7)[None]}
    q = torch.zeros(1, 2, 7, 4)
    s = relpos.scores(q, q, enc, inputs=inputs)
    assert s[0, 0, 3, 1] == -1.0 and s[0, 0, 3, 3] == 0.0 and s[0, 0, 3, 5] == 1.0  # clipped
    assert s[0, 1, 3, 4] == 30.0 and torch.isinf(s[0, :, 3, 0]).all()
    enc2 = relpos.create("reading-order", num_heads=2, head_dim=4, mask_non_adjacent=False)
    assert torch.isfinite(relpos.scores(q, q, enc2, inputs=inputs)).all()


def test_precomputed_codes_equal_the_adjacency_and_order():
    adj = star(6, 2, [0, 5])
    order = torch.tensor([[5, 1, 3, 0, 2, 4]])
    enc = relpos.create("reading-order", num_heads=2, head_dim=4)
    with torch.no_grad():
        enc.table.normal_()
    q = torch.randn(1, 2, 6, 4)
    a = relpos.scores(q, q, enc, inputs={"adjacency": adj, "reading_order": order})
    codes = reading_order_codes(adj, order)
    b = relpos.scores(q, q, enc, inputs={"reading_codes": codes})
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "order, message",
    [
        (torch.tensor([[0, 1, 1, 2]]), "distinct"),
        (torch.tensor([[0.0, float("nan"), 1.0, 2.0]]), "finite"),
        (torch.tensor([[0, 1, 2]]), "shape"),
    ],
)
def test_bad_reading_orders_are_refused_by_name(order, message):
    with pytest.raises(ValueError, match=message):
        reading_order_codes(star(4, 0, [1]), order)
