"""relpos.nn's recurrent token mixers: GateLoop, LightNetAttention, MDTPE (decoding with the
returned state equals the full forward; image / video shapes; causality per axis)."""

from __future__ import annotations

import pytest
import torch

from relpos.nn import MDTPE, GateLoop, LightNetAttention
from relpos.positions_nd import grid_positions


def decode(layer, x, prefix):
    y, state = layer(x[:, :prefix], return_state=True)
    outs = [y]
    for t in range(prefix, x.shape[1]):
        y, state = layer(x[:, t : t + 1], state=state, return_state=True)
        outs.append(y)
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("layer_class", [GateLoop, LightNetAttention])
def test_decoding_equals_the_full_forward(layer_class):
    torch.manual_seed(0)
    layer = layer_class(16, 2).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    assert torch.allclose(decode(layer, x, 4), layer(x), atol=1e-10)


@pytest.mark.parametrize("layer_class", [GateLoop, LightNetAttention])
def test_layers_are_causal_and_train(layer_class):
    torch.manual_seed(1)
    layer = layer_class(8, 2)
    x = torch.randn(1, 9, 8, requires_grad=True)
    y = layer(x)
    y[:, 4].sum().backward()
    assert not x.grad[:, 5:].abs().any() and x.grad[:, :5].abs().any()
    assert all(p.grad is not None for p in layer.parameters())


def test_lightnet_on_an_image_grid_with_md_lrpe():
    torch.manual_seed(2)
    layer = LightNetAttention(16, 2, axes=2, causal=False)
    pos = grid_positions(3, 4)
    x = torch.randn(2, 12, 16)
    y = layer(x, positions=pos)
    assert y.shape == x.shape and torch.isfinite(y).all()
    with pytest.raises(ValueError, match="positions"):
        layer(x)


def test_md_tpe_is_causal_along_each_axis_of_a_video():
    torch.manual_seed(3)
    layer = MDTPE(8, 2, axes=3).double()
    x = torch.randn(1, 3, 4, 5, 8, dtype=torch.float64, requires_grad=True)
    y = layer(x)
    assert y.shape == x.shape
    y[0, 1, 2, 3].sum().backward()
    reach = x.grad[0].abs().sum(-1) > 0
    t, h, w = torch.meshgrid(torch.arange(3), torch.arange(4), torch.arange(5), indexing="ij")
    # only the same row / column / time line, and only earlier along that axis
    allowed = (
        ((h == 2) & (w == 3) & (t <= 1))
        | ((t == 1) & (w == 3) & (h <= 2))
        | ((t == 1) & (h == 2) & (w <= 3))
    )
    assert torch.equal(reach, allowed)


def test_bad_layer_arguments():
    with pytest.raises(ValueError, match="divisible"):
        GateLoop(10, 3)
    with pytest.raises(ValueError, match="mode must be"):
        GateLoop(8, 2, mode="fast")
    with pytest.raises(ValueError, match="shape"):
        MDTPE(8, 2)(torch.randn(1, 4, 8))
