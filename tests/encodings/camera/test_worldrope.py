"""WorldRoPE (a reconstruction from the abstract, assumed form): expected RoPE over Gaussian key
primitives projected into the query camera."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import relpos
from relpos import cameras
from relpos.encodings.camera.prope import lift
from relpos.encodings.camera.worldrope import PrimitiveHead, gaussian_expected_rotation

from .scene import IMAGE, K_PIX, camera_a, camera_b, world_G

F64 = torch.float64


def _worldrope(**options):
    opts = {"grid": (2, 2), "image_size": IMAGE, **options}
    return relpos.create("worldrope", num_heads=1, head_dim=16, **opts).double()


def _scene(depths, sigma=None, weights=None):
    """Tokens A0..A3, B0..B3 (x fastest) of the reference scene, with per-token primitives."""
    view = torch.stack([camera_a()] * 4 + [camera_b()] * 4)[None]
    pos = torch.tensor([[0, 0], [1, 0], [0, 1], [1, 1]] * 2, dtype=F64)[None]
    inputs = {"k_viewmats": view, "k_Ks": K_PIX.expand(1, 8, 3, 3), "k_depths": depths}
    if sigma is not None:
        inputs["k_depth_sigma"] = sigma
    if weights is not None:
        inputs["k_weights"] = weights
    return inputs, pos


def _qk(d=16):
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(1, 1, 8, d, generator=gen, dtype=F64) for _ in range(3))


def test_gaussian_expected_rotation_matches_the_spec_reference():
    """mu = .7, sigma = .4, omega = 3 -> E[e^{i omega x}] = -.2457349803 + .4201691066 i."""
    c, s = gaussian_expected_rotation(
        torch.tensor([[3.0, 0.0]], dtype=F64),
        torch.tensor([[0.7, 0.0]], dtype=F64),
        torch.tensor([[[0.16, 0.0], [0.0, 0.0]]], dtype=F64),
        torch.tensor([1.0], dtype=F64),
    )
    assert float(c) == pytest.approx(-0.2457349803, abs=1e-10)
    assert float(s) == pytest.approx(0.4201691066, abs=1e-10)
    assert math.hypot(float(c), float(s)) == pytest.approx(0.4867522560, abs=1e-10)


def _hermite(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gauss-Hermite nodes and weights for E[f(z)], z ~ N(0, 1)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(n)
    return torch.tensor(nodes, dtype=F64), torch.tensor(weights / weights.sum(), dtype=F64)


def test_gaussian_mixture_closed_form_matches_quadrature():
    omega = torch.tensor([[1.3, 0.0], [0.0, 0.7], [0.4, -0.9]], dtype=F64)
    mean = torch.tensor([[0.2, -0.5], [1.1, 0.3]], dtype=F64)
    L = torch.tensor([[[0.5, 0.0], [0.2, 0.3]], [[0.2, 0.0], [-0.1, 0.6]]], dtype=F64)
    w = torch.tensor([0.3, 0.7], dtype=F64)
    c, s = gaussian_expected_rotation(omega, mean, L @ L.transpose(-1, -2), w)
    z, wz = _hermite(40)
    zz = torch.stack(torch.meshgrid(z, z, indexing="ij"), -1).reshape(-1, 2)
    wzz = (wz[:, None] * wz[None]).reshape(-1)
    x = mean[:, None] + zz @ L.transpose(-1, -2)  # (K, N, 2)
    ang = x @ omega.T  # (K, N, P)
    wt = w[:, None, None] * wzz[None, :, None]
    torch.testing.assert_close(c, (wt * ang.cos()).sum((0, 1)), atol=1e-12, rtol=0)
    torch.testing.assert_close(s, (wt * ang.sin()).sum((0, 1)), atol=1e-12, rtol=0)


def _projected_patch(w2c_key, w2c_query, pos, depth):
    """Oracle: the patch-centre point at z-depth ``depth`` of key camera ``w2c_key``,
    projected into ``w2c_query`` (``lift(K) w2c``), in patch units of the 2x2 grid."""
    pix = (pos + 0.5) * 16.0
    X_cam = depth * (cameras.invert_K(K_PIX) @ torch.tensor([*pix, 1.0], dtype=F64))
    X_w = cameras.invert_se3(w2c_key) @ torch.cat((X_cam, torch.ones(1, dtype=F64)))
    Y = lift(K_PIX) @ w2c_query @ X_w
    return Y[:2] / Y[2] / 16.0 - 0.5


def test_a_point_support_is_rope_of_the_projected_key_coordinates():
    """K = 1, sigma = 0, no patch extent: each query sees RoPE of the key's point projected
    into its own camera (oracle: rope-axial with those continuous key positions)."""
    depth = torch.tensor([2.5, 3.1, 2.8, 3.3, 2.2, 2.9, 2.4, 3.0], dtype=F64)
    inputs, pos = _scene(depth[None, :, None])
    enc = _worldrope(patch_extent=False)
    q, k, _ = _qk()
    s = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos, inputs=inputs, scale=1.0)
    rope = relpos.create("rope-axial", num_heads=1, head_dim=16, base=100.0, layout="half")
    view = inputs["k_viewmats"][0]
    for i in range(8):
        kp = [_projected_patch(view[j], view[i], pos[0, j], depth[j]) for j in range(8)]
        kp = torch.stack(kp)
        qi, qp = q[..., i : i + 1, :], pos[:, i : i + 1]
        ref = relpos.scores(qi, k, rope.double(), q_pos=qp, k_pos=kp[None], scale=1.0)
        torch.testing.assert_close(s[..., i, :], ref[..., 0, :], atol=2e-5, rtol=0)
    # in its own camera a key projects onto its own patch: same-view blocks are plain RoPE
    plain = relpos.scores(q, k, rope.double(), q_pos=pos, k_pos=pos, scale=1.0)
    torch.testing.assert_close(s[..., :4, :4], plain[..., :4, :4], atol=2e-5, rtol=0)


def test_identical_cameras_are_2d_rope_with_the_patch_footprint_attenuation():
    gen = torch.Generator().manual_seed(2)
    depths = torch.exp(1 + 0.3 * torch.randn(1, 8, 3, generator=gen, dtype=F64))
    sigma = 0.5 * torch.rand(1, 8, 3, generator=gen, dtype=F64)
    inputs, pos = _scene(depths, sigma, torch.rand(1, 8, 3, generator=gen, dtype=F64))
    inputs["k_viewmats"] = camera_b()[None, None].expand(1, 8, 4, 4)
    q, k, _ = _qk()
    for extent in (True, False):
        enc = _worldrope(patch_extent=extent)
        s = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos, inputs=inputs, scale=1.0)
        qr, kr = enc.rotate_qk(q, k, pos, pos)  # no state: every key in its own camera
        torch.testing.assert_close(s, qr @ kr.transpose(-1, -2), atol=1e-12, rtol=0)
    # the footprint: a uniform pixel over the patch, variance 1/12 patch^2 per axis
    theta = enc.omega.abs().sum(-1)
    att = _worldrope().own_camera_attenuation()
    torch.testing.assert_close(att, torch.exp(-(theta**2) / 24), atol=1e-15, rtol=0)
    rope = relpos.create("rope-axial", num_heads=1, head_dim=16, base=100.0, layout="half")
    plain = relpos.scores(q, k, rope.double(), q_pos=pos, k_pos=pos, scale=1.0)
    torch.testing.assert_close(s, plain, atol=2e-5, rtol=0)  # patch_extent=False: RoPE


@pytest.mark.parametrize("extent, atol", [(False, 2e-3), (True, 2e-2)])
def test_the_first_order_projection_matches_quadrature_in_3d(extent, atol):
    """Integrating over the true support (depth ~ N(d, sigma^2) on the ray, and with
    ``patch_extent`` a pixel uniform over the patch) projected exactly into another camera
    agrees with the first-order closed form up to second-order terms (the perspective
    distortion of the patch footprint dominates: 1.3e-2); the footprint's attenuation beats
    the point approximation."""
    depth, sig = torch.tensor([[2.6, 3.2]], dtype=F64), torch.tensor([[0.08, 0.12]], dtype=F64)
    w = torch.tensor([[0.4, 0.6]], dtype=F64)
    enc = _worldrope(patch_extent=extent)
    view_b, K = camera_b()[None, None], K_PIX[None, None]
    pos = torch.tensor([[[1.0, 0.0]]], dtype=F64)
    X_w, A_w = enc.world_primitives(view_b, K, pos, depth[:, None], sig[:, None])
    mean, cov, seen = enc.project(camera_a(), K_PIX, X_w, A_w)
    assert bool(seen.all())
    c, s = gaussian_expected_rotation(enc.omega, mean, cov, w[:, None])
    z, wz = _hermite(24)
    g, wg = np.polynomial.legendre.leggauss(12 if extent else 1)
    g = torch.tensor(g / 2, dtype=F64) if extent else torch.zeros(1, dtype=F64)
    wg = torch.tensor(wg / 2, dtype=F64)
    parts = torch.meshgrid(torch.arange(2, dtype=F64), z, g, g, indexing="ij")
    comp, zn, gx, gy = (t.reshape(-1) for t in parts)
    comp = comp.long()
    wts = torch.meshgrid(w[0], wz, wg, wg, indexing="ij")
    weight = (wts[0] * wts[1] * wts[2] * wts[3]).reshape(-1)
    depth_n = depth[0, comp] + sig[0, comp] * zn
    pix = (pos[0, 0] + 0.5 + torch.stack((gx, gy), -1)) * 16.0
    ray = torch.cat((pix, torch.ones_like(gx)[:, None]), -1) @ cameras.invert_K(K_PIX).T
    X = torch.cat((depth_n[:, None] * ray, torch.ones_like(gx)[:, None]), -1)
    Y = X @ (lift(K_PIX) @ camera_a() @ cameras.invert_se3(camera_b())).T
    uv = Y[:, :2] / Y[:, 2:3] / 16.0 - 0.5
    ang = uv @ enc.omega.T
    ref_c, ref_s = (weight[:, None] * ang.cos()).sum(0), (weight[:, None] * ang.sin()).sum(0)
    torch.testing.assert_close(c[0, 0], ref_c, atol=atol, rtol=0)
    torch.testing.assert_close(s[0, 0], ref_s, atol=atol, rtol=0)
    if extent:  # the footprint's attenuation is first order: the point support misses it
        c0, _ = gaussian_expected_rotation(enc.omega, mean, torch.zeros_like(cov), w[:, None])
        assert float((c0[0, 0] - ref_c).abs().max()) > 1.5 * float((c[0, 0] - ref_c).abs().max())


def test_depth_doubt_attenuates_cross_view_keys_only():
    depth = torch.full((1, 8, 1), 2.8, dtype=F64)
    q, k, _ = _qk()
    sharp, pos = _scene(depth, torch.zeros_like(depth))
    vague, _ = _scene(depth, torch.full_like(depth, 0.6))
    enc = _worldrope(patch_extent=False)
    (rows_a, st_a), _ = enc.prepare_rotary(pos, pos, sharp).groups
    (_, st_v), _ = enc.prepare_rotary(pos, pos, vague).groups
    own = rows_a[0]  # the group of camera A's queries; A's keys are tokens 0..3
    amp_sharp = torch.hypot(st_a.k_cos, st_a.k_sin)[0]
    amp_vague = torch.hypot(st_v.k_cos, st_v.k_sin)[0]
    torch.testing.assert_close(amp_sharp, torch.ones_like(amp_sharp), atol=1e-12, rtol=0)
    key_cam = torch.tensor([0] * 4 + [1] * 4)
    other = key_cam != (0 if bool(own[0]) else 1)
    torch.testing.assert_close(amp_vague[~other], torch.ones_like(amp_vague[~other]))
    assert float(amp_vague[other].min()) < 0.95 and float(amp_vague.max()) <= 1 + 1e-12


def test_worldrope_is_invariant_to_a_rigid_world_change_and_trains_the_depths():
    gen = torch.Generator().manual_seed(4)
    depths = torch.exp(1 + 0.2 * torch.randn(1, 8, 2, generator=gen, dtype=F64))
    depths.requires_grad_(True)
    inputs, pos = _scene(depths, torch.full((1, 8, 2), 0.2, dtype=F64))
    enc = _worldrope(rotate_values=True)
    q, k, v = _qk()
    out = relpos.attention(q, k, v, enc, q_pos=pos, k_pos=pos, inputs=inputs)
    moved = {**inputs, "k_viewmats": cameras.apply_world_transform(inputs["k_viewmats"], world_G())}
    again = relpos.attention(q, k, v, enc, q_pos=pos, k_pos=pos, inputs=moved)
    torch.testing.assert_close(again, out, atol=1e-12, rtol=0)
    (g,) = torch.autograd.grad(out.square().sum(), depths)
    assert bool(torch.isfinite(g).all()) and float(g.abs().max()) > 0


def test_primitives_behind_the_query_camera_are_unseen():
    enc = _worldrope(patch_extent=False)
    X_w = torch.tensor([[[[0.0, 0.0, -5.0]]]], dtype=F64)  # behind camera A (at z = -3)
    mean, cov, seen = enc.project(camera_a(), K_PIX, X_w, torch.zeros(1, 1, 1, 3, 3, dtype=F64))
    assert not bool(seen.any()) and bool(torch.isfinite(mean).all())


def test_worldrope_refuses_bad_primitives_and_missing_geometry():
    depth = torch.full((1, 8, 2), 2.0, dtype=F64)
    inputs, pos = _scene(depth)
    q, k, v = _qk()
    enc = _worldrope()
    bad = {
        "k_depths": [-depth, depth[..., :0], depth[:, :5]],
        "k_depth_sigma": [-depth, depth[..., :1]],
        "k_weights": [-depth, torch.zeros_like(depth), depth[:, :3]],
    }
    for name, values in bad.items():
        for value in values:
            with pytest.raises(ValueError, match=name):
                relpos.attention(q, k, v, enc, q_pos=pos, k_pos=pos, inputs={**inputs, name: value})
    missing = {n: t for n, t in inputs.items() if n != "k_depths"}
    with pytest.raises(ValueError, match="k_depths"):
        relpos.attention(q, k, v, enc, q_pos=pos, k_pos=pos, inputs=missing)
    with pytest.raises(ValueError, match="grid"):
        bare = relpos.create("worldrope", num_heads=1, head_dim=16).double()
        relpos.attention(q, k, v, bare, q_pos=pos, k_pos=pos, inputs=inputs)
    with pytest.raises(ValueError, match="cache"):
        relpos.attention(
            q, k, v, enc, q_pos=pos, k_pos=pos, inputs=inputs, cache=relpos.nn.LayerCache()
        )
    with pytest.raises(ValueError, match="head_dim"):
        relpos.create("worldrope", num_heads=1, head_dim=2)


def test_primitive_head_starts_at_log_spaced_hypotheses_and_feeds_worldrope():
    head = PrimitiveHead(8, 3, depth_range=(1.0, 4.0), relative_sigma=0.2).double()
    x = torch.randn(1, 8, 8, dtype=F64, requires_grad=True)
    prims = head(x)
    torch.testing.assert_close(prims["k_depths"][0, 0], torch.tensor([1.0, 2.0, 4.0], dtype=F64))
    torch.testing.assert_close(
        prims["k_depth_sigma"] / prims["k_depths"], torch.full_like(prims["k_depths"], 0.2)
    )
    torch.testing.assert_close(prims["k_weights"], torch.full_like(prims["k_weights"], 1 / 3))
    inputs, pos = _scene(prims["k_depths"])
    inputs.update(prims)
    q, k, v = _qk()
    out = relpos.attention(q, k, v, _worldrope(), q_pos=pos, k_pos=pos, inputs=inputs)
    out.square().sum().backward()
    assert float(head.proj.weight.grad.abs().max()) > 0  # the geometry learns from the loss
    with pytest.raises(ValueError, match="depth_range"):
        PrimitiveHead(8, 2, depth_range=(3.0, 1.0))
    with pytest.raises(ValueError, match="x"):
        head(x[..., :4])


def test_worldrope_refuses_inputs_of_another_batch_size():
    depth = torch.full((2, 8, 2), 2.0, dtype=F64)
    inputs, pos = _scene(depth)
    inputs["k_viewmats"] = inputs["k_viewmats"].expand(3, 8, 4, 4)
    q, k, v = (t.expand(3, 1, 8, 16) for t in _qk())
    with pytest.raises(ValueError, match="k_depths"):
        relpos.attention(q, k, v, _worldrope(), q_pos=pos, k_pos=pos, inputs=inputs)
