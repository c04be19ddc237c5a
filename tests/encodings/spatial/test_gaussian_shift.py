"""gaussian-shift (Cordonnier et al. 2020, arXiv 1911.03584; S. Li et al. 2021, arXiv
2111.01353): heads as shifted Gaussians express a convolution, checked on worked values."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import relpos
from relpos.encodings.spatial.gaussian_shift import convolution_shifts

X = torch.tensor([1.0, 2.0, -1.0, 0.5, 3.0], dtype=torch.float64)
KERNEL = torch.tensor([0.2, -0.5, 1.0], dtype=torch.float64)  # taps at shifts -1, 0, +1


def convolve_by_attention(x: torch.Tensor, kernel: torch.Tensor, alpha: float) -> torch.Tensor:
    """1-D: three heads shifted by -1, 0, +1, no content logits; sum_h w_h out_h."""
    enc = relpos.create("gaussian-shift", num_heads=3, head_dim=1, dims=1).double()
    enc.set_shifts(convolution_shifts(3, 1), alpha)
    zeros = torch.zeros(1, 3, x.numel(), 1, dtype=torch.float64)
    v = x.view(1, 1, -1, 1).expand(1, 3, -1, 1)
    out = relpos.attention(zeros, zeros, v, enc, backend="eager")  # (1, 3, L, 1)
    return (kernel.view(1, 3, 1, 1) * out).sum(1).flatten()


@pytest.mark.parametrize(
    ("alpha", "expected"),
    [
        (1.0, [0.73546, -0.328969, 0.956507, 1.920154, 1.883451]),
        (5.0, [1.67006, -1.755447, 1.386371, 2.535927, 1.609695]),
        (20.0, [1.7, -1.8, 1.4, 2.55, 1.6]),
    ],
)
def test_spec_values_of_the_one_dimensional_convolution(alpha, expected):
    got = convolve_by_attention(X, KERNEL, alpha)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), atol=2e-6, rtol=0)


def test_sharp_heads_are_a_convolution_with_replicate_padding():
    got = convolve_by_attention(X, KERNEL, 60.0)
    padded = F.pad(X.view(1, 1, -1), (1, 1), mode="replicate")
    conv = F.conv1d(padded, KERNEL.view(1, 1, 3)).flatten()
    torch.testing.assert_close(got, conv, atol=1e-9, rtol=0)
    zero_padded = F.conv1d(X.view(1, 1, -1), KERNEL.view(1, 1, 3), padding=1).flatten()
    assert not torch.allclose(got[[0, -1]], zero_padded[[0, -1]])  # the borders differ


def test_two_dimensional_interior_matches_conv2d():
    """9 heads on the 3x3 grid of shifts at alpha = 30: the interior of a 6x7 image equals
    F.conv2d with the same 3x3 kernel (cross-correlation, row-major taps)."""
    gen = torch.Generator().manual_seed(0)
    rows, cols, channels = 6, 7, 2
    image = torch.randn(channels, rows, cols, generator=gen, dtype=torch.float64)
    kernel = torch.randn(3, 3, generator=gen, dtype=torch.float64)
    enc = relpos.create("gaussian-shift", num_heads=9, head_dim=channels).double()
    enc.set_shifts(convolution_shifts(3, 2), 30.0)
    grid = torch.stack(
        torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij"), -1
    ).reshape(-1, 2)
    tokens = image.reshape(channels, -1).T  # (L, C) in row-major order
    v = tokens.expand(1, 9, -1, -1)
    zeros = torch.zeros(1, 9, rows * cols, channels, dtype=torch.float64)
    out = relpos.attention(zeros, zeros, v, enc, q_pos=grid, k_pos=grid, backend="eager")
    mixed = (kernel.reshape(1, 9, 1, 1) * out).sum(1)[0].T.reshape(channels, rows, cols)
    conv = F.conv2d(image[:, None], kernel.view(1, 1, 3, 3))[:, 0]  # (C, rows-2, cols-2)
    torch.testing.assert_close(mixed[:, 1:-1, 1:-1], conv, atol=1e-9, rtol=0)


def test_heads_start_on_the_kernel_grid_when_they_can():
    enc = relpos.create("gaussian-shift", num_heads=9, head_dim=4)
    torch.testing.assert_close(enc.shift.detach(), convolution_shifts(3, 2))
    other = relpos.create("gaussian-shift", num_heads=4, head_dim=4)  # 4 is not K^2, K odd
    assert other.shift.shape == (4, 2)


def test_bad_shifts_and_alphas_are_refused():
    enc = relpos.create("gaussian-shift", num_heads=9, head_dim=4)
    with pytest.raises(ValueError, match="shift"):
        enc.set_shifts(torch.zeros(3, 2))
    with pytest.raises(ValueError, match="alpha"):
        enc.set_shifts(convolution_shifts(3, 2), -1.0)
