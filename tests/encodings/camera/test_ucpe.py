"""UCPE relative ray encoding: world-to-ray frames and the UCM lens (chengzhag/UCPE)."""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos import cameras
from relpos.encodings.camera.ucpe import (
    OrientationEmbedding,
    orientation_map,
    ucm_unproject,
    world_to_ray,
)

from .scene import IMAGE, camera_b, qk, tokens, world_G


def _ucpe(**options):
    return relpos.create(
        "ucpe", num_heads=1, head_dim=16, grid=(2, 2), image_size=IMAGE, **options
    ).double()


def test_world_to_ray_frames_are_rigid_and_look_along_the_ray():
    view = camera_b()[None].expand(3, 4, 4)
    d_cam = torch.nn.functional.normalize(
        torch.tensor([[0.1, -0.2, 1.0], [0, 0, 1.0], [-0.5, 0.4, 1.0]], dtype=torch.float64), dim=-1
    )
    T = world_to_ray(view, d_cam)
    cameras.check_viewmats(T)
    # the ray's z axis is the world direction of the ray, its origin the camera centre
    c = cameras.camera_centers(view)
    d_w = (view[:, :3, :3].transpose(-1, -2) @ d_cam[..., None])[..., 0]
    torch.testing.assert_close(T[:, 2, :3], d_w)
    torch.testing.assert_close(
        (T[:, :3, :3] @ c[..., None])[..., 0] + T[:, :3, 3], torch.zeros(3, 3, dtype=torch.float64)
    )
    # the central ray's frame is the camera's own
    torch.testing.assert_close(T[1], view[1], atol=1e-12, rtol=0)


def test_ucm_unprojection_inverts_the_ucm_projection():
    K = torch.tensor([[30.0, 0, 15], [0, 28, 17], [0, 0, 1]], dtype=torch.float64)
    px = torch.tensor([[3.0, 4.0], [15.0, 17.0], [29.0, 30.0]], dtype=torch.float64)
    for xi in (0.0, 0.4, 1.0):
        X = ucm_unproject(px, K, xi)
        u = K[0, 0] * X[:, 0] / (X[:, 2] + xi * X.norm(dim=-1)) + K[0, 2]
        v = K[1, 1] * X[:, 1] / (X[:, 2] + xi * X.norm(dim=-1)) + K[1, 2]
        torch.testing.assert_close(torch.stack((u, v), -1), px)
    pinhole = torch.stack(
        ((px[:, 0] - 15) / 30, (px[:, 1] - 17) / 28, torch.ones(3, dtype=torch.float64)), -1
    )
    torch.testing.assert_close(
        ucm_unproject(px, K, 0.0), torch.nn.functional.normalize(pinhole, dim=-1)
    )


def test_ucpe_is_invariant_and_reads_the_pixel_of_each_patch():
    t = tokens()
    enc = _ucpe()
    assert not enc.relative and enc.se3_invariant
    q, k = qk()
    inputs = {"k_viewmats": t["viewmats"], "k_Ks": t["Ks"]}
    moved = {**inputs, "k_viewmats": cameras.apply_world_transform(t["viewmats"], world_G())}
    s0 = relpos.scores(q, k, enc, q_pos=t["xy"], k_pos=t["xy"], inputs=inputs)
    s1 = relpos.scores(q, k, enc, q_pos=t["xy"], k_pos=t["xy"], inputs=moved)
    torch.testing.assert_close(s1, s0, atol=1e-12, rtol=0)
    shifted = relpos.scores(q, k, enc, q_pos=t["xy"] + 1, k_pos=t["xy"] + 1, inputs=inputs)
    assert float((shifted - s0).abs().max()) > 1e-3  # other pixels, other rays


def test_ucpe_needs_its_grid_and_intrinsics():
    t = tokens()
    q, k = qk()
    bare = relpos.create("ucpe", num_heads=1, head_dim=16).double()
    with pytest.raises(ValueError, match="grid"):
        relpos.scores(
            q,
            k,
            bare,
            q_pos=t["xy"],
            k_pos=t["xy"],
            inputs={"k_viewmats": t["viewmats"], "k_Ks": t["Ks"]},
        )
    with pytest.raises(ValueError, match="k_Ks"):
        relpos.scores(
            q, k, _ucpe(), q_pos=t["xy"], k_pos=t["xy"], inputs={"k_viewmats": t["viewmats"]}
        )


# --------------------------------------------------------------- absolute orientation map
def _rot_x(angle: float) -> torch.Tensor:
    return cameras.rotation_about((1.0, 0.0, 0.0), angle)


def _camera(R_w2c: torch.Tensor, centre=(0.0, 0.0, 0.0)) -> torch.Tensor:
    c = torch.tensor(centre, dtype=torch.float64)
    return cameras.extrinsics(R_w2c, -(R_w2c @ c))


def test_orientation_map_of_an_upright_camera_in_a_y_down_world():
    """w2c = I in UCPE's world (y down): every ray's latitude is its own elevation and the
    image centre's up direction is image-up (0, -1)."""
    K = torch.tensor([[20.0, 0, 16], [0, 20, 16], [0, 0, 1]], dtype=torch.float64)
    m = orientation_map(_camera(torch.eye(3, dtype=torch.float64))[None], K[None], (3, 3), IMAGE)
    assert m.shape == (9, 3)
    pix = cameras.patch_centers((3, 3), IMAGE)
    d = ucm_unproject(pix, K)
    torch.testing.assert_close(m[:, 2], torch.atan2(-d[:, 1], d[:, [0, 2]].norm(dim=-1)))
    torch.testing.assert_close(m[4], torch.tensor([0.0, -1.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(m[:, :2].norm(dim=-1), torch.ones(9, dtype=torch.float64))


def test_orientation_map_reads_pitch_and_roll_but_not_yaw_or_position():
    K = torch.tensor([[20.0, 0, 16], [0, 20, 16], [0, 0, 1]], dtype=torch.float64)
    pitch, roll = 0.3, 0.2
    R_roll = cameras.rotation_about((0.0, 0.0, 1.0), roll)
    R = R_roll @ _rot_x(pitch)  # w2c: pitched, then rolled about the optical axis
    base = orientation_map(_camera(R)[None], K[None], (3, 3), IMAGE)
    # centre ray: d_w = R^T e_z = (0, sin .3, cos .3) points below the horizon (y down), so
    # lat = -0.3; up = the world-up direction seen in the camera, projected (fx = fy)
    up_cam = R @ torch.tensor([0.0, -1.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(base[4, :2], up_cam[:2] / up_cam[:2].norm())
    assert float(base[4, 2]) == pytest.approx(-pitch, abs=1e-12)
    # the roll turns the image-up direction to (sin roll, -cos roll)
    assert float(base[4, 0]) == pytest.approx(math.sin(roll), abs=1e-12)
    # yaw about the world vertical and any translation leave the map unchanged
    G = torch.eye(4, dtype=torch.float64)
    G[:3, :3] = cameras.rotation_about((0.0, 1.0, 0.0), 1.3)
    G[:3, 3] = torch.tensor([3.0, -1.0, 2.0], dtype=torch.float64)
    moved = cameras.apply_world_transform(_camera(R)[None], G)
    torch.testing.assert_close(orientation_map(moved, K[None], (3, 3), IMAGE), base)
    # a tilt of the world (about x) does change it
    G[:3, :3] = _rot_x(0.4)
    tilted = cameras.apply_world_transform(_camera(R)[None], G)
    assert float((orientation_map(tilted, K[None], (3, 3), IMAGE) - base).abs().max()) > 1e-2


def test_orientation_map_with_a_fisheye_lens_and_its_embedding():
    K = torch.tensor([[12.0, 0, 16], [0, 12, 16], [0, 0, 1]], dtype=torch.float64)
    view = cameras.random_se3(2, generator=torch.Generator().manual_seed(0))[None]
    m = orientation_map(view, K.expand(1, 2, 3, 3), (4, 4), IMAGE, xi=0.6)
    assert m.shape == (1, 32, 3) and bool(torch.isfinite(m).all())
    torch.testing.assert_close(m[..., :2].norm(dim=-1), torch.ones(1, 32, dtype=torch.float64))
    emb = OrientationEmbedding(8).double()
    assert emb(m).shape == (1, 32, 8)
    with pytest.raises(ValueError, match="orientation"):
        emb(m[..., :2])
    with pytest.raises(ValueError, match="viewmats"):
        orientation_map(view * 2, K.expand(1, 2, 3, 3), (4, 4), IMAGE)
    with pytest.raises(ValueError, match="world_up"):
        orientation_map(view, K.expand(1, 2, 3, 3), (4, 4), IMAGE, world_up=(0.0, 0.0, 0.0))
