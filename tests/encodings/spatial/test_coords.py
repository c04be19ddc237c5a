"""CoordConv coordinate channels (``relpos.encodings.spatial.coords``): values, the radius
channel and the official centre, degenerate axes, and argument checks."""

from __future__ import annotations

import math

import pytest
import torch

from relpos.encodings.spatial.coords import add_coord_channels


def test_coord_channels_values():
    x = torch.randn(2, 3, 4, 5)
    out = add_coord_channels(x)
    assert out.shape == (2, 5, 4, 5)
    torch.testing.assert_close(out[:, :3], x)
    xs = torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0])
    ys = torch.tensor([-1.0, -1 / 3, 1 / 3, 1.0])
    torch.testing.assert_close(out[1, 3], xs.expand(4, 5))  # columns
    torch.testing.assert_close(out[1, 4], ys[:, None].expand(4, 5))  # rows


def test_coord_channels_radius_and_official_centre():
    x = torch.zeros(1, 1, 3, 3, dtype=torch.float64)
    r = add_coord_channels(x, with_r=True)[0, 3]
    assert r.dtype == torch.float64
    assert r[1, 1].item() == 0.0 and r[0, 0].item() == pytest.approx(math.sqrt(2))
    official = add_coord_channels(x, with_r=True, r_center=(0.5, 0.5))[0, 3]
    assert official[0, 0].item() == pytest.approx(math.sqrt(2 * 1.5**2))


def test_coord_channels_single_pixel_axis_and_errors():
    out = add_coord_channels(torch.ones(1, 2, 1, 4))
    assert out[0, 3].eq(0).all()  # y of a one-row map
    with pytest.raises(ValueError, match="x"):
        add_coord_channels(torch.ones(2, 3, 4))
    with pytest.raises(TypeError, match="floating"):
        add_coord_channels(torch.ones(1, 1, 2, 2, dtype=torch.long))


def test_coord_channel_options_follow_the_policy():
    x = torch.zeros(1, 1, 2, 2)
    with pytest.raises(TypeError, match="with_r"):
        add_coord_channels(x, with_r=1)
    with pytest.raises(ValueError, match="r_center"):
        add_coord_channels(x, with_r=True, r_center=(0.5,))
    with pytest.raises(ValueError, match="r_center"):
        add_coord_channels(x, with_r=True, r_center=(math.nan, 0.0))
    with pytest.raises(TypeError, match="r_center"):
        add_coord_channels(x, with_r=True, r_center="00")
