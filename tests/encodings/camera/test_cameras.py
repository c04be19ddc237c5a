"""relpos.cameras: conventions, closed-form inverses, rays and Plücker coordinates, against
hand-worked values."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos import cameras

from .scene import K_PIX, camera_a, camera_b, qk, tokens, world_G


def test_look_at_builds_world_to_camera_matrices():
    w2c = camera_b()
    cameras.check_viewmats(w2c)
    centre = torch.tensor([2.0, 0.5, -2.0], dtype=torch.float64)
    torch.testing.assert_close(cameras.camera_centers(w2c), centre)
    # the origin (the target) lies on the optical axis, in front of the camera
    X = w2c @ torch.tensor([0, 0, 0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(X[:2], torch.zeros(2, dtype=torch.float64), atol=1e-15, rtol=0)
    assert float(X[2]) == pytest.approx(float(centre.norm()))


def test_closed_form_inverses_match_linalg_inv():
    m = cameras.random_se3(5, translation_std=3.0, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(cameras.invert_se3(m), torch.linalg.inv(m))
    torch.testing.assert_close(cameras.invert_K(K_PIX), torch.linalg.inv(K_PIX))
    R = m[:, :3, :3]
    torch.testing.assert_close(torch.linalg.det(R), torch.ones(5, dtype=torch.float64))


def test_rotation_about_matches_the_spec_matrix():
    expected = torch.tensor(
        [
            [0.497115, -0.312738, -0.809365],
            [0.022613, 0.937139, -0.348222],
            [0.867390, 0.154805, 0.472938],
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(world_G()[:3, :3], expected, atol=1e-6, rtol=0)


def test_anchor_is_the_relative_pose():
    views = torch.stack((camera_a(), camera_b()))[None]
    rel = cameras.anchor(views, 0)
    torch.testing.assert_close(rel[0, 0], torch.eye(4, dtype=torch.float64), atol=1e-15, rtol=0)
    expected = torch.tensor(  # w2c_B c2w_A = inverse of w2c_A c2w_B
        [
            [0.707107, -0.123091, 0.696311, -2],
            [0, 0.984732, 0.174078, -0.5],
            [-0.707107, -0.123091, 0.696311, 1],
            [0, 0, 0, 1],
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(cameras.invert_se3(rel[0, 1]), expected, atol=1e-6, rtol=0)
    # a rigid world change does not change the anchored cameras
    moved = cameras.anchor(cameras.apply_world_transform(views, world_G()), 0)
    torch.testing.assert_close(moved, rel, atol=1e-12, rtol=0)


def test_plucker_coordinates_match_the_spec():
    o = torch.tensor([2.0, 0.5, -2.0], dtype=torch.float64)
    d = torch.nn.functional.normalize(torch.tensor([0.3, 0, 0], dtype=torch.float64) - o, dim=0)
    p = cameras.ray_plucker(o, d)
    torch.testing.assert_close(
        p[3:],
        torch.tensor([-0.636209, -0.187120, 0.748481], dtype=torch.float64),
        atol=1e-6,
        rtol=0,
    )
    torch.testing.assert_close(
        p[:3], torch.tensor([0, -0.224544, -0.056136], dtype=torch.float64), atol=1e-6, rtol=0
    )
    # independent of the point on the ray
    torch.testing.assert_close(cameras.ray_plucker(o + 2.7 * d, d), p, atol=1e-15, rtol=0)
    # after the world change: d' = R d, m' = R m + t x R d
    G = world_G()
    p2 = cameras.ray_plucker(G[:3, :3] @ o + G[:3, 3], G[:3, :3] @ d)
    torch.testing.assert_close(
        p2[3:],
        torch.tensor([-0.863544, -0.450382, -0.226823], dtype=torch.float64),
        atol=1e-6,
        rtol=0,
    )
    torch.testing.assert_close(
        p2[:3],
        torch.tensor([3.721976, -5.101571, -4.040305], dtype=torch.float64),
        atol=1e-6,
        rtol=0,
    )


def test_plucker_of_patch_rays_world_and_first_camera_frames():
    views = torch.stack((camera_a(), camera_b()))[None]
    Ks = K_PIX.expand(1, 2, 3, 3)
    world = cameras.plucker(views, Ks, (2, 2), (32, 32))
    assert world.shape == (1, 8, 6)
    torch.testing.assert_close(world[..., 3:].norm(dim=-1), torch.ones(1, 8, dtype=torch.float64))
    moved = cameras.apply_world_transform(views, world_G())
    assert float((cameras.plucker(moved, Ks, (2, 2), (32, 32)) - world).abs().max()) > 0.1
    first = cameras.plucker(views, Ks, (2, 2), (32, 32), frame="first")
    torch.testing.assert_close(
        cameras.plucker(moved, Ks, (2, 2), (32, 32), frame="first"), first, atol=1e-12, rtol=0
    )
    # the first camera's rays start at the origin in its own frame: zero moments
    torch.testing.assert_close(
        first[0, :4, :3], torch.zeros(4, 3, dtype=torch.float64), atol=1e-15, rtol=0
    )


def test_float32_drift_far_from_the_origin_and_the_anchor_fix():
    """float32 logits drift with |t|; re-anchoring in float64 removes it."""
    t = tokens()
    enc64 = relpos.create("prope", num_heads=1, head_dim=16, image_size=(32, 32)).double()
    enc32 = relpos.create("prope", num_heads=1, head_dim=16, image_size=(32, 32))
    q, k = qk()
    xy = t["xy"]

    def logits(enc, view, dtype):
        return relpos.scores(
            q.to(dtype),
            k.to(dtype),
            enc,
            q_pos=xy,
            k_pos=xy,
            scale=1.0,
            inputs={"k_viewmats": view.to(dtype), "k_Ks": t["Ks"].to(dtype)},
        ).double()

    ref = logits(enc64, t["viewmats"], torch.float64)
    errors = []
    for far in (0.0, 1e2, 1e4):
        G = torch.eye(4, dtype=torch.float64)
        G[:3, 3] = torch.tensor([far, -far, far], dtype=torch.float64) / 3**0.5
        view = cameras.apply_world_transform(t["viewmats"], G)
        errors.append(float((logits(enc32, view, torch.float32) - ref).abs().max()))
        fixed = cameras.anchor(view, 0, dim=1)
        assert float((logits(enc32, fixed, torch.float32) - ref).abs().max()) < 2e-6
    assert errors[0] < 2e-6 < 1e-4 < errors[2]


BAD = [
    (lambda m: m.clone().index_fill_(-2, torch.tensor([3]), 0.5), "bottom row"),
    (lambda m: m * 1.5 + torch.diag(torch.tensor([0, 0, 0, -0.5], dtype=m.dtype)), "R\\^T R = I"),
    (lambda m: torch.diag(torch.tensor([-1.0, 1, 1, 1], dtype=m.dtype)) @ m, "det R = \\+1"),
]


@pytest.mark.parametrize("i", range(len(BAD)))
def test_check_viewmats_refuses_non_rigid_matrices(i):
    bad, message = BAD[i]
    with pytest.raises(ValueError, match=message):
        cameras.check_viewmats(bad(camera_a()), "viewmats")
    with pytest.raises(ValueError, match="shape"):
        cameras.check_viewmats(torch.eye(3), "viewmats")
    with pytest.raises(TypeError, match="viewmats"):
        cameras.check_viewmats(torch.eye(4, dtype=torch.long), "viewmats")


def test_check_intrinsics_refuses_bad_intrinsics():
    for change, message in (((0, 0), "fx > 0"), ((0, 1), "skew"), ((2, 1), "rows")):
        K = K_PIX.clone()
        K[change] = -2.0 if change == (0, 0) else 0.3
        with pytest.raises(ValueError, match=message):
            cameras.check_intrinsics(K, "Ks")


def test_expand_cameras_and_patch_centres():
    views = torch.stack((camera_a(), camera_b()))[None]
    out = cameras.expand_cameras(views, torch.tensor([[1, 0, 1]]))
    torch.testing.assert_close(out[0], torch.stack((camera_b(), camera_a(), camera_b())))
    with pytest.raises(ValueError, match="camera_index"):
        cameras.expand_cameras(views, torch.tensor([[2]]))
    c = cameras.patch_centers((2, 2), (32, 32))
    torch.testing.assert_close(
        c, torch.tensor([[8.0, 8], [24, 8], [8, 24], [24, 24]], dtype=torch.float64)
    )
