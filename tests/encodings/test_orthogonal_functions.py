"""Orthogonal-function PEs (Y. Li 2025, arXiv 2506.06398): known Legendre polynomial values,
orthogonality on the grid (continuous Legendre is not, discrete and
Haar are), the clamp beyond the window, and use in a model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import relpos
from relpos.encodings.orthogonal_functions import haar_wavelets, legendre


def test_legendre_polynomials_match_the_spec_reference_values():
    x = torch.tensor([-1.0, 0.0, 0.5, 1.0, 1.5], dtype=torch.float64)
    expected = torch.tensor(
        [
            [1, -1, 1, -1, 1],
            [1, 0, -0.5, 0, 0.375],
            [1, 0.5, -0.125, -0.4375, -0.289062],
            [1, 1, 1, 1, 1],
            [1, 1.5, 2.875, 6.1875, 14.085938],
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(legendre(x, 5), expected, atol=1e-6, rtol=0)


def test_legendre_polynomials_are_orthogonal_on_the_interval():
    # Gauss-Legendre quadrature of P_j P_k: 2 / (2k + 1) on the diagonal, 0 elsewhere
    nodes, weights = (torch.from_numpy(a) for a in np.polynomial.legendre.leggauss(12))
    phi = legendre(nodes, 6)
    gram = phi.T @ (weights[:, None] * phi)
    torch.testing.assert_close(gram, torch.diag(2.0 / (2 * torch.arange(6) + 1.0)).double())


def _gram(name: str, length: int, dim: int, **options):
    enc = relpos.create(name, num_heads=2, head_dim=4, max_length=length, scale=1.0, **options)
    pe = enc.embed(torch.arange(length)[None], dim)[0].double()
    return pe.T @ pe


def test_continuous_legendre_is_not_orthogonal_on_the_grid_but_discrete_is():
    gram = _gram("legendre", 8, 4)
    assert gram[0, 2] == pytest.approx(1.1429, abs=1e-4)
    assert gram[1, 3] == pytest.approx(1.3294, abs=1e-4)
    discrete = _gram("legendre", 8, 4, discrete=True)
    torch.testing.assert_close(discrete, 8.0 * torch.eye(4, dtype=torch.float64), atol=1e-5, rtol=0)


def test_discrete_channels_stay_polynomials_of_their_degree():
    """Gram-Schmidt in degree order: channel k is P_k plus lower degrees, so channel 1 of
    the discrete basis is affine in the position (also between and beyond grid points)."""
    enc = relpos.create(
        "legendre", num_heads=2, head_dim=4, max_length=8, discrete=True, clamp=False, scale=1.0
    )
    p = torch.tensor([[0.0, 2.5, 5.0, 11.0]])
    pe = enc.embed(p, 4)[0].double()
    slope = (pe[1, 1] - pe[0, 1]) / 2.5
    torch.testing.assert_close(pe[:, 1], pe[0, 1] + slope * p[0].double(), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="dim must be <= max_length"):
        enc.embed(p, 9)


def test_haar_channels_are_orthogonal_on_a_dyadic_grid():
    torch.testing.assert_close(_gram("wavelet-haar", 16, 16), 16.0 * torch.eye(16).double())
    t = torch.tensor([0.1, 0.3, 0.6, 0.9], dtype=torch.float64)
    # phi, psi, then level 1: sqrt(2) psi(2t), sqrt(2) psi(2t - 1)
    expected = torch.tensor(
        [[1, 1, 2**0.5, 0], [1, 1, -(2**0.5), 0], [1, -1, 0, 2**0.5], [1, -1, 0, -(2**0.5)]],
        dtype=torch.float64,
    )
    torch.testing.assert_close(haar_wavelets(t, 4), expected)


@pytest.mark.parametrize("name", ["legendre", "wavelet-haar"])
def test_clamp_bounds_positions_beyond_the_window(name):
    clamped = relpos.create(name, num_heads=2, head_dim=4, max_length=16)
    free = relpos.create(name, num_heads=2, head_dim=4, max_length=16, clamp=False)
    far = torch.tensor([[15.0, 40.0, 1000.0]])
    pe = clamped.embed(far, 8)
    torch.testing.assert_close(pe[0, 1], pe[0, 0])
    torch.testing.assert_close(pe[0, 2], pe[0, 0])
    raw = free.embed(far, 8)
    if name == "legendre":  # the polynomials blow up beyond x = 1
        assert raw[0, 2].abs().max() > 1e6 * raw[0, 0].abs().max()
    else:  # Haar functions vanish outside [0, 1)
        assert (raw[0, 1:] == 0).all()


@pytest.mark.parametrize("name", ["legendre", "wavelet-haar"])
def test_model_adds_the_embedding_and_default_scale(name):
    enc = relpos.create(name, num_heads=2, head_dim=4)
    pe = enc.embed(torch.arange(5)[None], 64)
    assert pe.shape == (1, 5, 64) and pe.dtype == torch.float32
    ref = relpos.create(name, num_heads=2, head_dim=4, scale=1.0).embed(torch.arange(5)[None], 64)
    torch.testing.assert_close(pe, ref / 8.0)
    model = relpos.nn.TransformerLM(11, dim=16, depth=1, num_heads=2, encoding=name)
    out = model(torch.randint(0, 11, (2, 7)))
    assert out.shape == (2, 7, 11) and torch.isfinite(out).all()
