"""UCPE relative ray encoding: world-to-ray frames and the UCM lens (camera spec §2.5)."""

from __future__ import annotations

import torch

import relpos
from relpos import cameras
from relpos.encodings.camera.ucpe import ucm_unproject, world_to_ray

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
    import pytest

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
