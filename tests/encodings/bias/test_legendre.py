"""The Legendre distance bias (relative form of Y. Li 2025's Legendre PE, arXiv
2506.06398): the formula ``b_h(n) = sum_k c_hk P_k(2n / max_length - 1)`` against known
polynomial values, the clamp, and training through the per-distance table."""

from __future__ import annotations

import torch

import relpos


def test_bias_is_the_legendre_expansion_of_the_distance():
    enc = relpos.create("legendre-bias", num_heads=2, head_dim=4, degree=5, max_length=8)
    with torch.no_grad():
        enc.coefficients.copy_(torch.tensor([[1.0, 0, 0, 0, 0], [0, 0, 0, 0, 1.0]]))
    # n = 0, 4, 6, 8 -> x = -1, 0, 0.5, 1; head 1 reads P_4: 1, 0.375, -0.289062, 1
    table = enc.distance_table(0, 8, torch.device("cpu"))
    torch.testing.assert_close(table[0], torch.ones(9))
    got = table[1, [0, 4, 6, 8]]
    torch.testing.assert_close(got, torch.tensor([1.0, 0.375, -0.2890625, 1.0]))


def test_clamp_holds_distances_in_the_window():
    enc = relpos.create("legendre-bias", num_heads=1, head_dim=4, degree=4, max_length=8)
    free = relpos.create(
        "legendre-bias", num_heads=1, head_dim=4, degree=4, max_length=8, clamp=False
    )
    with torch.no_grad():
        enc.coefficients.fill_(1.0)
        free.coefficients.fill_(1.0)
    h = torch.zeros(3, dtype=torch.long)
    d = torch.tensor([-5, 8, 20])
    clamped = enc.bias_at_distance(h, d)
    torch.testing.assert_close(clamped, torch.tensor([0.0, 4.0, 4.0]))  # sum P_k(-1), P_k(1)
    # x = 4: 1 + 4 + 23.5 + 154 = 182.5 without the clamp
    assert float(free.bias_at_distance(h[:1], d[2:])[0]) == 182.5


def test_coefficients_train_on_the_toeplitz_path():
    enc = relpos.create("legendre-bias", num_heads=2, head_dim=8)
    q = torch.randn(1, 2, 64, 8, requires_grad=True)
    assert relpos.attention.plan(q, q, q, enc, causal=True, backend="chunked")[1] == "toeplitz"
    out = relpos.attention(q, q, q, enc, causal=True, backend="chunked")
    (grad,) = torch.autograd.grad(out.square().sum(), enc.coefficients)
    assert grad[:, 1:].abs().sum() > 0
