"""Point-PQAE's VRPE helper (aHapBean/Point-PQAE, arXiv 2509.01250)."""

from __future__ import annotations

import math

import pytest
import torch

from relpos.encodings.camera.vrpe import vrpe


def test_vrpe_layout_and_values():
    centres = torch.tensor([[[0.5, -1.0, 0.0]]], dtype=torch.float64)
    offset = torch.tensor([[0.2, 0.0, 3.0]], dtype=torch.float64)
    e = vrpe(centres, offset, 24)[0, 0]  # n = 2 frequencies: 1 and 10000^-1/2 = 0.01
    assert e.shape == (24,)
    coords = [0.5, -1.0, 0.0, 0.2, 0.0, 3.0]
    for a, u in enumerate(coords):
        block = e[4 * a : 4 * a + 4]
        expected = [math.sin(u), math.sin(0.01 * u), math.cos(u), math.cos(0.01 * u)]
        torch.testing.assert_close(block, torch.tensor(expected, dtype=torch.float64))


def test_vrpe_refuses_bad_sizes():
    with pytest.raises(ValueError, match="dim"):
        vrpe(torch.zeros(1, 2, 3), torch.zeros(1, 3), 20)
    with pytest.raises(ValueError, match="centres"):
        vrpe(torch.zeros(1, 2, 2), torch.zeros(1, 3), 24)
