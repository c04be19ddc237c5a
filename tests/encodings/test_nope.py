"""NoPE: the logits are the scaled dot products, whatever the positions."""

from __future__ import annotations

import torch

import relpos


def test_nope_scores_are_the_scaled_dot_products_at_any_positions():
    enc = relpos.create("nope", num_heads=2, head_dim=8)
    assert enc.family == "none" and not enc.has_bias and not enc.has_rotary
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 5, 8, generator=gen), torch.randn(1, 2, 7, 8, generator=gen)
    expected = q @ k.transpose(-1, -2) / 8**0.5
    torch.testing.assert_close(relpos.scores(q, k, enc), expected)
    far = torch.arange(7) * 1000
    torch.testing.assert_close(relpos.scores(q, k, enc, q_pos=far[:5], k_pos=far), expected)
