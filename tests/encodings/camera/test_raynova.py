"""RAYNOVA axial Plücker-ray RoPE: a reference logit computed from the official formula and its
layout."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos import cameras
from relpos.encodings.camera.raynova import ray_coordinates

from .scene import world_G

O_A = torch.tensor([0.0, 0, -3], dtype=torch.float64)
D_A = torch.tensor([0.1, 0.05, 1], dtype=torch.float64)
O_B = torch.tensor([2.0, 0.5, -2], dtype=torch.float64)
D_B = torch.tensor([-0.6, -0.1, 0.6], dtype=torch.float64)


def _two_rays():
    """Two one-patch cameras whose centre rays are (o_A, d_A) and (o_B, d_B)."""
    view = torch.stack([cameras.look_at(o, o + d / d.norm()) for o, d in ((O_A, D_A), (O_B, D_B))])
    K = torch.tensor([[1.0, 0, 1], [0, 1, 1], [0, 0, 1]], dtype=torch.float64)
    return {"k_viewmats": view[None], "k_Ks": K.expand(1, 2, 3, 3)}


def _logit(inputs):
    enc = relpos.create("raynova", num_heads=1, head_dim=16, grid=(1, 1), image_size=(2, 2))
    c = torch.arange(16.0, dtype=torch.float64)
    q = torch.cos(0.3 * c).expand(1, 1, 2, 16)
    k = torch.sin(0.2 * c + 0.1).expand(1, 1, 2, 16)
    pos = torch.zeros(1, 2, 3)
    return relpos.scores(q, k, enc.double(), q_pos=pos, k_pos=pos, scale=1.0, inputs=inputs)[
        0, 0, 0, 1
    ]


def test_raynova_logit_and_its_change_under_a_world_transform_match_the_spec():
    inputs = _two_rays()
    assert float(_logit(inputs)) == pytest.approx(0.093705, abs=2e-6)
    moved = {**inputs, "k_viewmats": cameras.apply_world_transform(inputs["k_viewmats"], world_G())}
    assert float(_logit(moved)) == pytest.approx(1.471747, abs=2e-6)


def test_ray_coordinates_are_time_direction_and_moment():
    inputs = _two_rays()
    pos = torch.tensor([[[3.0, 0, 0], [5.0, 0, 0]]], dtype=torch.float64)
    co = ray_coordinates(inputs["k_viewmats"], inputs["k_Ks"], pos, (1, 1), (2, 2))
    torch.testing.assert_close(co[0, :, 0], torch.tensor([3.0, 5.0], dtype=torch.float64))
    torch.testing.assert_close(co[0, 1, 1:4], D_B / D_B.norm())
    torch.testing.assert_close(co[0, 1, 4:], torch.linalg.cross(O_B, D_B / D_B.norm()))
    centre = ray_coordinates(
        inputs["k_viewmats"], inputs["k_Ks"], pos, (1, 1), (2, 2), moment=False
    )
    torch.testing.assert_close(centre[0, 1, 4:], O_B)


def test_raynova_sections_and_head_dim():
    enc = relpos.create("raynova", num_heads=1, head_dim=32)
    sizes = [2 * f.numel() for f in enc._freqs]
    assert sizes == [8, 4, 4, 4, 4, 4, 4]
    torch.testing.assert_close(
        enc._freqs[0], 30 * torch.tensor([1, 100**-0.25, 0.1, 100**-0.75], dtype=torch.float64)
    )
    assert not enc.se3_invariant and not enc.relative and not enc.rotates_values
    with pytest.raises(ValueError, match="head_dim"):
        relpos.create("raynova", num_heads=1, head_dim=24)
