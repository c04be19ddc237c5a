"""Defining properties of the rotary variants (beyond the conformance suite).

HoPE has no low frequencies and no long-term decay; p-RoPE is HF's "proportional"; LieRE with a
zero generator is the identity and with 2x2 blocks is RoPE; HARoPE with the identity map is
RoPE; RoVE rotates values and outputs as written by hand; CARoPE with a constant frequency is
RoPE and its phase differences depend only on the tokens in between; hyperbolic-rope decays
monotonically; MinkowskiPE boosts along time and rotates along space. Grouped-query calls
equal the call with keys repeated when the shared parameters agree within each group.
"""

from __future__ import annotations

import math

import pytest
import torch

import relpos


def randn(*shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def ones_scores(enc, length: int, head_dim: int) -> torch.Tensor:
    """Score of an all-ones query at distance ``0 .. length-1`` from an all-ones key at 0."""
    q = torch.ones(1, 1, length, head_dim)
    k = torch.ones(1, 1, 1, head_dim)
    out = relpos.scores(q, k, enc, q_pos=torch.arange(length), k_pos=torch.tensor([0]), scale=1.0)
    return out[0, 0, :, 0].double()


def test_liere_with_zero_generator_is_the_identity():
    enc = relpos.create("liere", num_heads=2, head_dim=8, dims=2)
    with torch.no_grad():
        enc.generator.zero_()
    x = randn(1, 2, 5, 8, seed=1)
    pos = randn(1, 5, 2, seed=2) * 100
    torch.testing.assert_close(enc.rotate(x, pos, "q"), x)


def test_liere_1d_is_relative_with_dense_generators():
    enc = relpos.create("liere", num_heads=2, head_dim=8, expected_steps=8.0)
    assert enc.relative
    q, k = randn(1, 2, 6, 8, seed=1), randn(1, 2, 6, 8, seed=2)
    pos = torch.tensor([0, 3, 4, 9, 10, 15])
    ref = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos)
    torch.testing.assert_close(relpos.scores(q, k, enc, q_pos=pos + 999, k_pos=pos + 999), ref)


def test_liere_2d_dense_generators_are_not_relative_but_2x2_blocks_are():
    q, k = randn(1, 2, 6, 8, seed=1), randn(1, 2, 6, 8, seed=2)
    pos = randn(1, 6, 2, seed=3) * 4
    dense = relpos.create("liere", num_heads=2, head_dim=8, dims=2, expected_steps=4.0)
    assert not dense.relative
    moved = relpos.scores(q, k, dense, q_pos=pos + 3, k_pos=pos + 3)
    assert not torch.allclose(moved, relpos.scores(q, k, dense, q_pos=pos, k_pos=pos), atol=1e-3)
    blocks = relpos.create("liere", num_heads=2, head_dim=8, dims=2, generator_dim=2)
    assert blocks.relative
    torch.testing.assert_close(
        relpos.scores(q, k, blocks, q_pos=pos + 3, k_pos=pos + 3),
        relpos.scores(q, k, blocks, q_pos=pos, k_pos=pos),
        rtol=1e-4,
        atol=1e-4,
    )


def test_liere_bad_generator_dim():
    with pytest.raises(ValueError, match="generator_dim"):
        relpos.create("liere", num_heads=1, head_dim=8, generator_dim=3)
    with pytest.raises(ValueError, match="expected_steps"):
        relpos.create("liere", num_heads=1, head_dim=8, expected_steps=0)


def test_minkowski_boosts_along_time_and_rotates_along_space():
    enc = relpos.create("minkowski", num_heads=1, head_dim=8, dims=2, max_rapidity=0.01)
    rate = float(enc.rates[0])
    light = torch.zeros(1, 1, 1, 8)
    light[..., 0], light[..., 1] = 1.0, -1.0  # q on the (1, -1) light-cone line of block 0
    key = torch.zeros(1, 1, 1, 8)
    key[..., 0], key[..., 1] = 1.0, 1.0  # k on (1, 1)
    for dt in (0.0, 5.0, 40.0):
        s = relpos.scores(
            light,
            key,
            enc,
            q_pos=torch.tensor([[[0.0, 3.0]]]),
            k_pos=torch.tensor([[[dt, 3.0]]]),
            scale=1.0,
        )
        # q^T eta B(kappa dt) k = (1, 1) . (1, 1) e^{kappa dt}
        torch.testing.assert_close(s.flatten(), torch.tensor([2 * math.exp(rate * dt)]))
    spatial = randn(1, 1, 2, 8, seed=1)
    spatial[..., [0, 1, 4, 5]] = 0  # rotation planes only: plain 1-D RoPE in the space axis
    pos = torch.tensor([[[7.0, 2.0], [7.0, 9.0]]])
    s = relpos.scores(spatial[:, :, :1], spatial[:, :, 1:], enc, q_pos=pos[:, :1], k_pos=pos[:, 1:])
    rope = relpos.create("rope", num_heads=1, head_dim=4, layout="interleaved", base=1e4)
    ref = relpos.scores(
        spatial[:, :, :1][..., [2, 3, 6, 7]],
        spatial[:, :, 1:][..., [2, 3, 6, 7]],
        rope,
        q_pos=torch.tensor([2]),
        k_pos=torch.tensor([9]),
        scale=8**-0.5,
    )
    torch.testing.assert_close(s, ref)


def test_minkowski_rejects_bad_options_and_overflowing_rapidities():
    with pytest.raises(ValueError, match="dims"):
        relpos.create("minkowski", num_heads=1, head_dim=8, dims=1)
    with pytest.raises(ValueError, match="head_dim"):
        relpos.create("minkowski", num_heads=1, head_dim=6)
    enc = relpos.create("minkowski", num_heads=1, head_dim=8, dims=2, max_rapidity=1.0)
    pos = torch.tensor([[[0, 0], [500, 0]]])
    with pytest.raises(ValueError, match="max_rapidity"):
        relpos.scores(randn(1, 1, 2, 8), randn(1, 1, 2, 8), enc, q_pos=pos, k_pos=pos)
