"""Feature maps of kernelized attention (Performer PRF, elu+1, relu)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from relpos.attention.linear.feature_maps import (
    EluPlusOne,
    PositiveRandomFeatures,
    ReLUFeatures,
    create_feature_map,
    orthogonal_gaussian,
)


def test_orthogonal_blocks_are_orthogonal_with_gaussian_row_lengths():
    w = orthogonal_gaussian(40, 16, torch.Generator().manual_seed(0))
    assert w.shape == (40, 16)
    for block in (w[:16], w[16:32]):
        unit = block / block.norm(dim=1, keepdim=True)
        torch.testing.assert_close(unit @ unit.T, torch.eye(16, dtype=torch.float64))
    # chi(16) lengths: mean ~ sqrt(16 - 1/2), not all equal to one value
    norms = w.norm(dim=1)
    assert 3.0 < float(norms.mean()) < 5.0 and float(norms.std()) > 0.1


@pytest.mark.parametrize("orthogonal", [True, False])
def test_prf_estimates_the_softmax_kernel(orthogonal):
    """``E[phi(q) . phi(k)] = exp(q . k * scale)`` (without normalisation, offsets undone)."""
    gen = torch.Generator().manual_seed(1)
    q = 0.6 * torch.randn(1, 1, 5, 8, generator=gen, dtype=torch.float64)
    k = 0.6 * torch.randn(1, 1, 5, 8, generator=gen, dtype=torch.float64)
    scale = 8**-0.5
    fm = PositiveRandomFeatures(8, 4096, normalize=False, orthogonal=orthogonal, seed=3)
    pq, _ = fm(q, "q", scale)
    pk, off = fm(k, "k", scale)
    # undo the per-row query offset and the per-head key offset to compare absolute values
    x = q * math.sqrt(scale)
    wx = x @ fm.projection.T - 0.5 * (x * x).sum(-1, keepdim=True)
    pq = pq * torch.exp(wx.amax(-1, keepdim=True))
    est = (pq @ pk.transpose(-1, -2)) * torch.exp(off)
    exact = torch.exp(q @ k.transpose(-1, -2) * scale)
    assert float(((est - exact) / exact).abs().max()) < 0.1


def test_prf_is_seeded_and_redraws():
    a, b = PositiveRandomFeatures(8, 16, seed=5), PositiveRandomFeatures(8, 16, seed=5)
    assert torch.equal(a.projection, b.projection)
    assert not torch.equal(a.projection, PositiveRandomFeatures(8, 16, seed=6).projection)
    before = a.projection.clone()
    a.redraw(torch.Generator().manual_seed(9))
    assert not torch.equal(before, a.projection)
    assert "projection" in a.state_dict()


def test_prf_is_positive_and_finite_for_large_inputs():
    x = 200.0 * torch.randn(2, 3, 7, 8)
    fm = PositiveRandomFeatures(8, 32, normalize=False)
    for role in ("q", "k"):
        phi, off = fm(x, role, 8**-0.5)
        assert torch.isfinite(phi).all() and (phi >= 0).all() and phi.amax() > 0
        assert (off is None) == (role == "q")
    assert off is not None and off.shape == (2, 3, 1, 1)


def test_prf_normalizes_q_and_k_by_default():
    fm = PositiveRandomFeatures(8, 16)
    x = torch.randn(1, 1, 4, 8)
    torch.testing.assert_close(fm(x, "q", 0.3)[0], fm(7.0 * x, "q", 0.3)[0])


def test_deterministic_maps():
    x = torch.randn(2, 2, 3, 4, dtype=torch.float64)
    torch.testing.assert_close(EluPlusOne(4)(x, "q", 1.0)[0], F.elu(x) + 1)
    torch.testing.assert_close(ReLUFeatures(4)(x, "k", 1.0)[0], F.relu(x))
    half = EluPlusOne(4)(x.to(torch.bfloat16), "q", 1.0)[0]
    assert half.dtype == torch.float32


def test_create_feature_map_by_name_and_errors_name_the_argument():
    assert isinstance(create_feature_map("prf", 8, num_features=32), PositiveRandomFeatures)
    assert create_feature_map("elu1", 8).num_features == 8
    fm = ReLUFeatures(8)
    assert create_feature_map(fm, 8) is fm
    with pytest.raises(ValueError, match="feature_map must be one of"):
        create_feature_map("softmax", 8)
    with pytest.raises(TypeError, match="feature_map"):
        create_feature_map(3, 8)
    with pytest.raises(ValueError, match="head_dim=8"):
        create_feature_map(fm, 16)
    with pytest.raises(ValueError, match="num_features"):
        PositiveRandomFeatures(8, 0)
    with pytest.raises(TypeError, match="normalize"):
        PositiveRandomFeatures(8, 4, normalize="yes")
    with pytest.raises(ValueError, match="head_dim=8"):
        fm(torch.randn(1, 1, 2, 4), "q", 1.0)
