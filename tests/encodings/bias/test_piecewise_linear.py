"""The ReLU MLP of one scalar read as its linear pieces (FIRE's fast exact path) equals the
per-pair MLP in value and in every gradient."""

from __future__ import annotations

import torch

import relpos
from relpos.encodings.bias.piecewise_linear import evaluate_pieces, relu_mlp_pieces


def _mlp(u, w1, b1, w2, b2):
    """The per-pair MLP: ``W2 relu(w1 u + b1) + b2`` for every head, ``(H, *u.shape)``."""
    hidden = torch.relu(u[..., None] * w1 + b1)
    return torch.movedim(hidden @ w2.t() + b2, -1, 0)


def _params(K=32, H=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    w1, b1 = torch.randn(K, generator=g, dtype=dtype), torch.randn(K, generator=g, dtype=dtype)
    w1[3] = 0.0  # a unit without a knot: a constant relu(b1)
    b1[5] = b1[6] * w1[5] / w1[6]  # two units with the same knot
    w2, b2 = torch.randn(H, K, generator=g, dtype=dtype), torch.randn(H, generator=g, dtype=dtype)
    return [t.requires_grad_(True) for t in (w1, b1, w2, b2)]


def test_pieces_equal_the_mlp_in_value_and_gradients():
    params = _params()
    g = torch.Generator().manual_seed(1)
    u = (torch.rand(7, 50, generator=g, dtype=torch.float64) * 6 - 3).requires_grad_(True)
    weight = torch.randn(4, 7, 50, generator=g, dtype=torch.float64)
    exact = _mlp(u, *params)
    fast = evaluate_pieces(u, *relu_mlp_pieces(*params))
    torch.testing.assert_close(fast, exact, rtol=0, atol=1e-12)
    ge = torch.autograd.grad((exact * weight).sum(), [u, *params])
    gf = torch.autograd.grad((fast * weight).sum(), [u, *params])
    for a, b in zip(gf, ge, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_pieces_have_one_interval_more_than_knots_and_are_continuous():
    w1, b1, w2, b2 = (t.detach() for t in _params())
    knots, alpha, beta = relu_mlp_pieces(w1, b1, w2, b2)
    assert knots.numel() == 31 and alpha.shape == beta.shape == (4, 32)
    assert (knots[1:] >= knots[:-1]).all()
    left = alpha[:, :-1] + beta[:, :-1] * knots  # each piece meets the next at its knot
    right = alpha[:, 1:] + beta[:, 1:] * knots
    torch.testing.assert_close(left, right, rtol=0, atol=1e-10)


def test_fire_above_threshold_equals_its_per_pair_mlp_forward_and_gradients():
    """FIRE with every query above its threshold (the tile path): the bias and the gradients
    of c, the threshold and the MLP equal the per-pair MLP (FIRE's scalar-at-a-time
    ``readout``, FlexAttention's form)."""
    torch.manual_seed(0)
    enc = relpos.create("fire", num_heads=4, head_dim=8, init_L=4.0).double()
    q_pos, k_pos = torch.arange(20, 40), torch.arange(40)
    u = enc.mlp_input(q_pos[:, None], k_pos[None, :])  # (T, S), queries above L = 4
    grid = enc.readout(u[None, None], torch.arange(4).view(1, -1, 1, 1))[0]
    per_pair = torch.stack([enc.readout(u, torch.tensor(h)) for h in range(4)])
    torch.testing.assert_close(grid, per_pair, rtol=0, atol=1e-12)
    w = torch.randn(grid.shape, dtype=torch.float64)
    params = list(enc.parameters())
    g_grid = torch.autograd.grad((grid * w).sum(), params, retain_graph=True)
    g_pair = torch.autograd.grad((per_pair * w).sum(), params)
    for a, b in zip(g_grid, g_pair, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
