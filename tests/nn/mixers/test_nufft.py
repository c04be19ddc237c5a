"""The torch NUFFT (ES kernel, FINUFFT's method): types 1 and 2 and the fused convolution
match their dense sums to the requested tolerance, in 1, 2 and 3 dimensions."""

from __future__ import annotations

import math

import pytest
import torch

from relpos.nn.mixers.nufft import NUFFTGrid, kernel_width, nufft_convolve, nufft_type1, nufft_type2


def _modes(K: int, d: int) -> torch.Tensor:
    k = torch.arange(-K, K + 1, dtype=torch.float64)
    return torch.stack(torch.meshgrid(*([k] * d), indexing="ij"), -1).reshape(-1, d)


def _case(d: int, L: int = 40, K: int = 6, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    pts = 2 * math.pi * torch.rand(L, d, generator=gen, dtype=torch.float64) * 3 - 5  # any reals
    x = torch.randn(L, 2, generator=gen, dtype=torch.float64)
    E = torch.exp(-1j * (_modes(K, d) @ pts.T))  # (G, L)
    return pts, x, E


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("tol", [1e-4, 1e-9])
def test_type1_and_type2_match_the_dense_sums_to_the_tolerance(d, tol):
    K = 6
    pts, x, E = _case(d, K=K)
    grid = NUFFTGrid.create(K, d, tol)
    X = nufft_type1(pts, x, grid).reshape(2, -1).T  # (G, 2)
    dense = E @ x.to(torch.complex128)
    assert float((X - dense).abs().max()) <= tol * float(x.abs().sum(0).max())
    c = torch.randn(2, *([2 * K + 1] * d), dtype=torch.complex128)
    y = nufft_type2(pts, c, grid)
    dense_y = E.conj().T @ c.reshape(2, -1).T
    assert float((y - dense_y).abs().max()) <= tol * float(c.abs().reshape(2, -1).sum(-1).max())


@pytest.mark.parametrize("d,upsampling", [(1, 2.0), (3, 2.0), (3, 1.25)])
def test_the_fused_convolution_is_type2_of_the_multiplied_type1(d, upsampling):
    K, tol = 5, 1e-10
    pts, x, E = _case(d, K=K, seed=1)
    out_pts = torch.rand(9, d, dtype=torch.float64) * 7
    grid = NUFFTGrid.create(K, d, tol, upsampling)
    assert grid.fine == (24 if upsampling == 2.0 else 32)  # >= 2 w: the kernel fits
    w = torch.rand(1, *([2 * K + 1] * d), dtype=torch.float64)
    w = (w + w.flip(list(range(1, d + 1)))) / 2  # real and even
    y = nufft_convolve(out_pts, pts, x, w, grid)
    Eo = torch.exp(1j * (_modes(K, d) @ out_pts.T))  # (G, 9)
    dense = (Eo.T @ (w.reshape(-1, 1) * (E @ x.to(torch.complex128)))).real
    # error bound: tol * sum_j |x_j| * sum_k |W_k| (type 1's error, carried by each mode)
    assert float((y - dense).abs().max()) <= tol * float(x.abs().sum(0).max() * w.sum())


def test_gradients_reach_the_values_and_the_multiplier():
    K = 2
    pts, x, _ = _case(2, L=5, K=K)
    grid = NUFFTGrid.create(K, 2, 1e-6)
    x = x.requires_grad_()
    w = torch.rand(1, 5, 5, dtype=torch.float64)
    w = ((w + w.flip([1, 2])) / 2).requires_grad_()
    torch.autograd.gradcheck(
        lambda a, b: nufft_convolve(pts, pts, a, b, grid), (x, w), fast_mode=True
    )


def test_kernel_width_follows_the_tolerance_and_refuses_bad_values():
    assert [kernel_width(t) for t in (1e-2, 1e-6, 1e-12)] == [3, 7, 13]
    assert [kernel_width(t, 1.25) for t in (1e-2, 1e-6)] == [4, 10]
    small, big = NUFFTGrid.cheapest(20, 3, 1e-6, 100), NUFFTGrid.cheapest(2, 3, 1e-6, 10**6)
    assert (small.upsampling, big.upsampling) == (1.25, 2.0)
    with pytest.raises(ValueError, match="tol"):
        kernel_width(0.0)
    with pytest.raises(ValueError, match="dims"):
        NUFFTGrid.create(4, 4, 1e-6)
