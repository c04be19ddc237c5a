"""``relpos.nn.ConvolutionAttention``: MHSA computing a given convolution through its relative
encoding (S. Li et al. 2021, arXiv 2111.01353; Cordonnier et al. 2020's construction), with
``F.conv{1,2,3}d`` as the oracle."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from relpos.nn import ConvolutionAttention

X = torch.tensor([[[1.0, 2.0, -1.0, 0.5, 3.0]]])
KERNEL = torch.tensor([[[0.2, -0.5, 1.0]]])  # taps at Delta = -1, 0, +1


@pytest.mark.parametrize(
    "alpha, expected",
    [
        (1.0, [0.73546, -0.328969, 0.956507, 1.920154, 1.883451]),
        (5.0, [1.67006, -1.755447, 1.386371, 2.535927, 1.609695]),
        (20.0, [1.7, -1.8, 1.4, 2.55, 1.6]),
    ],
)
def test_spec_1d_values_approach_the_convolution_as_alpha_grows(alpha, expected):
    layer = ConvolutionAttention(KERNEL, alpha=alpha)
    torch.testing.assert_close(layer(X)[0, 0], torch.tensor(expected), rtol=1e-5, atol=1e-5)


def test_1d_interior_is_the_zero_padded_conv_and_the_ends_replicate():
    out = ConvolutionAttention(KERNEL)(X)[0, 0]
    zero = F.conv1d(X, KERNEL, padding=1)[0, 0]
    assert torch.allclose(zero, torch.tensor([1.5, -1.8, 1.4, 2.55, -1.4]))
    torch.testing.assert_close(out[1:-1], zero[1:-1])
    replicate = F.conv1d(F.pad(X, (1, 1), mode="replicate"), KERNEL)[0, 0]
    torch.testing.assert_close(out, replicate)


@pytest.mark.parametrize("size", [3, 5])
def test_2d_equals_conv2d_with_replicate_padding(size):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 6, 7, generator=gen)
    weight = torch.randn(4, 3, size, size, generator=gen)
    bias = torch.randn(4, generator=gen)
    layer = ConvolutionAttention(weight, bias)
    assert layer.heads == size * size
    out = layer(x)
    half = size // 2
    ref = F.conv2d(F.pad(x, (half,) * 4, mode="replicate"), weight, bias)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    interior = F.conv2d(x, weight, bias)  # no padding: the interior outputs
    torch.testing.assert_close(out[..., half:-half, half:-half], interior, rtol=1e-5, atol=1e-5)


def test_3d_equals_conv3d_with_replicate_padding():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, 2, 4, 3, 5, generator=gen)
    weight = torch.randn(2, 2, 3, 3, 3, generator=gen)
    out = ConvolutionAttention(weight)(x)
    ref = F.conv3d(F.pad(x, (1,) * 6, mode="replicate"), weight)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_the_relative_encoding_is_essential_without_it_every_head_averages():
    weight = torch.randn(1, 1, 3, 3, generator=torch.Generator().manual_seed(2))
    layer = ConvolutionAttention(weight)
    x = torch.randn(1, 1, 5, 5, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        layer.encoding.log_alpha.fill_(-30.0)  # alpha -> 0: uniform attention in every head
    out = layer(x)
    expected = weight.sum() * x.mean()
    torch.testing.assert_close(out, expected.expand_as(out), rtol=1e-4, atol=1e-5)


def test_learnable_layer_trains_its_maps_and_shifts():
    layer = ConvolutionAttention(torch.randn(2, 2, 3), learnable=True, alpha=2.0)
    layer(torch.randn(1, 2, 8)).square().sum().backward()
    assert layer.out_maps.grad is not None and layer.encoding.shift.grad is not None


@pytest.mark.parametrize(
    "weight, message",
    [
        (torch.randn(2, 2, 4, 4), "odd kernel size"),
        (torch.randn(2, 2, 3, 5), "odd kernel size"),
        (torch.randn(2, 2), "1 to 3 axes"),
    ],
)
def test_bad_kernels_are_refused_by_name(weight, message):
    with pytest.raises(ValueError, match=message):
        ConvolutionAttention(weight)


def test_bad_input_names_the_expected_shape():
    layer = ConvolutionAttention(torch.randn(2, 3, 3, 3))
    with pytest.raises(ValueError, match=r"x must have shape \(B, 3, S, S\)"):
        layer(torch.randn(1, 2, 4, 4))
