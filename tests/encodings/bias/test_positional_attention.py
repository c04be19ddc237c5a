"""Positional attention (Back de Luca et al. 2025, arXiv 2410.01686): a hand-built
previous-token head, weights independent of the content, the two bases."""

from __future__ import annotations

import math

import pytest
import torch

import relpos


def weights(enc, q, k, **kw) -> torch.Tensor:
    """The attention weights, read through the output with ``v = I`` (one-hot values)."""
    lk = k.shape[2]
    v = torch.eye(lk, dtype=q.dtype).expand(q.shape[0], k.shape[1], lk, lk)
    return relpos.attention(q, k, v, enc, **kw)


def test_one_hot_previous_token_head_matches_the_spec_reference():
    enc = relpos.create("positional-attention", num_heads=1, head_dim=4, max_positions=4).double()
    with torch.no_grad():  # P = I, W_Q W_K^T = 5 S (S: the sub-diagonal shift)
        enc.w_q.copy_(math.sqrt(5) * torch.eye(4)[None])
        enc.w_k.copy_(math.sqrt(5) * torch.eye(4).roll(1, dims=1)[None])
    x = torch.randn(1, 1, 4, 4, dtype=torch.float64)
    a = weights(enc, x, x, causal=True)[0, 0]
    expected = torch.tensor(
        [
            [1, 0, 0, 0],
            [0.993307, 0.006693, 0, 0],
            [0.006648, 0.986703, 0.006648, 0],
            [0.006604, 0.006604, 0.980187, 0.006604],
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(a, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("basis", ["one-hot", "sinusoidal"])
def test_weights_do_not_depend_on_the_content(basis):
    enc = relpos.create("positional-attention", num_heads=2, head_dim=8, basis=basis)
    gen = torch.Generator().manual_seed(0)
    x1, x2 = (torch.randn(2, 2, 9, 8, generator=gen) for _ in range(2))
    torch.testing.assert_close(weights(enc, x1, x1, causal=True), weights(enc, x2, x2, causal=True))
    # the content still flows through the values; q and k get zero gradients
    q = x1.clone().requires_grad_(True)
    v = x2.clone().requires_grad_(True)
    out = relpos.attention(q, q, v, enc, causal=True)
    gq, gv = torch.autograd.grad(out.square().sum(), (q, v))
    assert (gq == 0).all() and gv.abs().sum() > 0


def test_sinusoidal_basis_takes_any_position_and_one_hot_its_table():
    sin = relpos.create("positional-attention", num_heads=2, head_dim=8, basis="sinusoidal")
    assert sin.continuous and sin.max_positions is None
    x = torch.randn(1, 2, 5, 8)
    pos = torch.tensor([0.5, 1.5, 1e5, 1e5 + 1, 3e6])
    assert torch.isfinite(relpos.attention(x, x, x, sin, q_pos=pos, k_pos=pos)).all()
    one_hot = relpos.create("positional-attention", num_heads=2, head_dim=8, max_positions=4)
    with pytest.raises(ValueError, match="max_positions=4"):
        relpos.attention(x, x, x, one_hot)
    with pytest.raises(ValueError, match="basis_dim"):
        relpos.create(
            "positional-attention", num_heads=2, head_dim=8, basis="sinusoidal", basis_dim=7
        )


def test_initial_logits_have_unit_variance_and_no_scale():
    enc = relpos.create("positional-attention", num_heads=4, head_dim=64, max_positions=256)
    x = torch.zeros(1, 4, 256, 64)
    logits = relpos.scores(x, x, enc)
    assert enc.default_scale(64) == 1.0
    assert 0.8 < float(logits.detach().std()) < 1.25


def test_every_layer_of_a_model_attends_by_position():
    model = relpos.nn.TransformerLM(
        11,
        dim=16,
        depth=2,
        num_heads=2,
        encoding="positional-attention",
        encoding_options={"max_positions": 32},
    )
    out = model(torch.randint(0, 11, (2, 7)))
    assert out.shape == (2, 7, 11) and torch.isfinite(out).all()
