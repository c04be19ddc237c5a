"""Grid coordinates and grid sizes shared by the spatial encodings
(``relpos.encodings.spatial.grid``): row-major window coordinates, per-axis bounds, and
size options that follow the validation policy (``TypeError`` for a wrong type,
``ValueError`` for a wrong value, the message names the option)."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos.encodings.spatial.grid import GridSize, grid_coordinates
from relpos.encodings.spatial.swin import swin_window_coordinates

H, D = 4, 8


def test_window_coordinates_are_row_major():
    coords = swin_window_coordinates((2, 3))
    assert coords.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]


@pytest.mark.parametrize("name", ["swin-2d", "swin-v2", "mvitv2"])
def test_coordinates_outside_the_window_raise_per_axis(name):
    enc = relpos.create(
        name,
        num_heads=H,
        head_dim=D,
        **{
            "swin-2d": {"window_size": (3, 5)},
            "swin-v2": {"window_size": (3, 5)},
            "mvitv2": {"q_size": (3, 5)},
        }[name],
    )
    q = torch.randn(1, H, 2, D)
    ok = torch.tensor([[[2, 4], [0, 0]]])  # axis 1 reaches 4 < 5
    relpos.scores(q, q, enc, q_pos=ok, k_pos=ok)
    for bad in (
        torch.tensor([[[3, 0], [0, 0]]]),
        torch.tensor([[[0, 5], [0, 0]]]),
        torch.tensor([[[0, -1], [0, 0]]]),
    ):
        with pytest.raises(ValueError, match="max_positions"):
            relpos.scores(q, q, enc, q_pos=bad, k_pos=ok)


def test_bad_window_sizes_name_the_argument():
    for bad in (0, (7,), (7, 7, 7)):
        with pytest.raises(ValueError, match="window_size"):
            relpos.create("swin-2d", num_heads=H, head_dim=D, window_size=bad)
    for bad in ((7, 2.5), "7", True):  # wrong types: TypeError under the policy
        with pytest.raises(TypeError, match="window_size"):
            relpos.create("swin-2d", num_heads=H, head_dim=D, window_size=bad)
    with pytest.raises(ValueError, match="window_size"):
        relpos.create("swin-v2", num_heads=H, head_dim=D, window_size=1)  # W - 1 = 0
    with pytest.raises(ValueError, match="kv_size"):
        relpos.create("mvitv2", num_heads=H, head_dim=D, kv_size=(4, 0))


def test_swin_window_coordinates_are_the_grid_coordinates():
    assert swin_window_coordinates is grid_coordinates
    assert grid_coordinates((2, 1, 2)).tolist() == [[0, 0, 0], [0, 0, 1], [1, 0, 0], [1, 0, 1]]


def test_grid_size_option_normalises_ints_and_sequences_to_tuples():
    spec = GridSize(dims=3)
    assert spec(4, "window_size") == (4, 4, 4)
    assert spec([2, 3, 4], "window_size") == (2, 3, 4)
    assert GridSize(dims=2, optional=True)(None, "q_size") is None
    enc = relpos.create("swin-3d", num_heads=H, head_dim=D, window_size=[2, 3, 4])
    assert enc.window_size == (2, 3, 4)
    assert enc.relative_position_bias_table.shape == (3 * 5 * 7, H)
    with pytest.raises(ValueError, match=r"kv_size\[1\]"):
        relpos.create("mvitv2", num_heads=H, head_dim=D, kv_size=(4, 0))
    with pytest.raises(ValueError, match="pretrained_window_size"):
        relpos.create("swin-v2", num_heads=H, head_dim=D, pretrained_window_size=1)
    relpos.create("swin-v2", num_heads=H, head_dim=D, window_size=1, pretrained_window_size=2)
