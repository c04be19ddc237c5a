"""EscherNet CaPE 6-DoF: equals EscherNet's row-vector formula (kxhit/EscherNet)."""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos import cameras

from .scene import qk, tokens, world_G


def _eschernet_logits(q, k, view):
    """EscherNet ``cape_embed``: row-vector 4-chunks times the pose; queries ``P^-T``, keys
    ``P`` (written from the paper's formula, with ``torch.linalg.inv`` as the oracle)."""
    B, H, L, D = q.shape
    P = view[:, None, :, None]  # (B, 1, L, 1, 4, 4)
    qr = (q.reshape(B, H, L, D // 4, 1, 4) @ torch.linalg.inv(P).transpose(-1, -2)).reshape(q.shape)
    kr = (k.reshape(B, H, L, D // 4, 1, 4) @ P).reshape(k.shape)
    return qr @ kr.transpose(-1, -2)


def test_cape_equals_the_eschernet_formula():
    enc = relpos.create("cape-6dof", num_heads=1, head_dim=16).double()
    q, k = qk()
    view = tokens()["viewmats"]
    s = relpos.scores(q, k, enc, scale=1.0, inputs={"k_viewmats": view})
    torch.testing.assert_close(s, _eschernet_logits(q, k, view), atol=1e-12, rtol=0)


def test_cape_is_invariant_and_leaves_values_alone():
    enc = relpos.create("cape-6dof", num_heads=1, head_dim=16).double()
    assert not enc.rotates_values and enc.se3_invariant and enc.dims == 1
    q, k = qk()
    view = tokens()["viewmats"]
    moved = cameras.apply_world_transform(view, world_G())
    a = relpos.attention(q, k, k, enc, inputs={"k_viewmats": view})
    b = relpos.attention(q, k, k, enc, inputs={"k_viewmats": moved})
    torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    # identical cameras: plain attention (NoPE)
    same = {"k_viewmats": view[:, :1].expand_as(view)}
    plain = torch.softmax(q @ k.transpose(-1, -2) / 4, -1) @ k
    torch.testing.assert_close(
        relpos.attention(q, k, k, enc, inputs=same), plain, atol=1e-12, rtol=0
    )


def _rot2(x):
    """EscherNet's ``rotate_every_two``: ``(x0, x1) -> (-x1, x0)`` on interleaved pairs."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)


def test_spherical_pose_of_a_known_camera():
    from relpos.encodings.camera.cape import spherical_pose

    c = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
    pose = spherical_pose(cameras.look_at(c * 1.1))
    r = float((c * 1.1).norm())
    expected = [
        math.acos(1 / math.sqrt(3)),
        math.pi / 4,
        math.pi * (math.log(r) - math.log(1.5)) / (math.log(2.2) - math.log(1.5)),
        0.0,
    ]
    torch.testing.assert_close(pose, torch.tensor(expected, dtype=torch.float64))
    far = spherical_pose(cameras.look_at(c * 10))
    assert float(far[2]) == pytest.approx(math.pi)  # the radius is clipped to 2.2


def test_cape_4dof_equals_the_eschernet_formula_and_ignores_azimuth_offsets():
    from relpos.encodings.camera.cape import spherical_pose

    enc = relpos.create("cape-4dof", num_heads=1, head_dim=16).double()
    q, k = qk()
    view = tokens()["viewmats"]
    s = relpos.scores(q, k, enc, scale=1.0, inputs={"k_viewmats": view})
    m = spherical_pose(view)[0].repeat_interleave(4, dim=-1)  # (L, 16): each number on D/4
    qr, kr = q * m.cos() + _rot2(q) * m.sin(), k * m.cos() + _rot2(k) * m.sin()
    torch.testing.assert_close(s, qr @ kr.transpose(-1, -2), atol=1e-12, rtol=0)
    # rotating every camera about the world z axis shifts every azimuth alike (cameras off
    # the z axis, where the azimuth is defined: camera A of the scene sits on it)
    view = cameras.apply_world_transform(view, world_G())
    s = relpos.scores(q, k, enc, scale=1.0, inputs={"k_viewmats": view})
    G = torch.eye(4, dtype=torch.float64)
    G[:3, :3] = cameras.rotation_about((0.0, 0.0, 1.0), 0.8)
    turned = relpos.scores(
        q, k, enc, scale=1.0, inputs={"k_viewmats": cameras.apply_world_transform(view, G)}
    )
    torch.testing.assert_close(turned, s, atol=1e-12, rtol=0)
    moved = relpos.scores(
        q, k, enc, scale=1.0, inputs={"k_viewmats": cameras.apply_world_transform(view, world_G())}
    )  # a general rigid change is not a symmetry
    assert float((moved - s).abs().max()) > 1e-2 and not enc.se3_invariant
    with pytest.raises(ValueError, match="head_dim"):
        relpos.create("cape-4dof", num_heads=1, head_dim=12)
