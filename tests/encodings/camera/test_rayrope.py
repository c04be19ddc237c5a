"""RayRoPE: coordinates in the query frame, frequencies, expected RoPE and the query-grouped
evaluation, against reference values computed from the official code (Lucas-707/RayRoPE)."""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos import cameras
from relpos.encodings.camera.prope import lift
from relpos.encodings.camera.rayrope import expected_rotation, rayrope_frequencies

from .scene import IMAGE, K_PIX, camera_a, camera_b, world_G


def _rayrope(**options):
    opts = {"grid": (2, 2), "image_size": IMAGE, "rays_per_patch": 1, **options}
    return relpos.create("rayrope", num_heads=1, head_dim=24, **opts).double()


def _tokens():
    """A0, A1, B0, B1 at uv (-.25, -.25), (.25, .1) (patch positions (0, 0), (1, 0.7) on a
    2x2 grid, one ray per patch); depths A (2.5, 3.1), B (2.2, 2.9)."""
    view = torch.stack([camera_a(), camera_a(), camera_b(), camera_b()])[None]
    pos = torch.tensor([[[0, 0], [1, 0.7], [0, 0], [1, 0.7]]], dtype=torch.float64)
    depth = torch.tensor([[2.5, 3.1, 2.2, 2.9]], dtype=torch.float64)
    return view, K_PIX.expand(1, 4, 3, 3), pos, depth


def test_key_coordinates_in_the_query_frame_match_the_spec():
    view, Ks, pos, depth = _tokens()
    enc = _rayrope()
    K = cameras.normalize_K(Ks, IMAGE)
    w2c = camera_a()[None, None]
    coords = enc.coordinates_in(w2c, lift(K[:, :1]) @ w2c, view, K, pos, depth)[0]
    expected = torch.tensor(
        [
            [0, 0, 0, -0.235702, -0.235702, 2.5],
            [0, 0, 0, 0.241402, 0.096561, 3.1],
            [-2, -0.5, 1, -0.291189, -0.221001, 2.897171],
            [-2, -0.5, 1, 0.189449, 0.110249, 2.580622],
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(coords, expected, atol=1e-6, rtol=0)
    # invariance of the coordinates under a rigid world change (to float64 rounding)
    G = world_G()
    moved = cameras.apply_world_transform(view, G)
    w2c_m = cameras.apply_world_transform(w2c, G)
    again = enc.coordinates_in(w2c_m, lift(K[:, :1]) @ w2c_m, moved, K, pos, depth)[0]
    torch.testing.assert_close(again, coords, atol=1e-12, rtol=0)


def test_frequencies_match_the_spec():
    torch.testing.assert_close(
        rayrope_frequencies(2, 4.0),
        torch.tensor([1.570796, 4.712389], dtype=torch.float64),
        atol=1e-6,
        rtol=0,
    )
    torch.testing.assert_close(
        rayrope_frequencies(2, 8.0),
        torch.tensor([0.785398, 2.356194], dtype=torch.float64),
        atol=1e-6,
        rtol=0,
    )
    torch.testing.assert_close(
        rayrope_frequencies(2, 80.0),
        torch.tensor([0.078540, 0.235619], dtype=torch.float64),
        atol=1e-6,
        rtol=0,
    )
    p0 = rayrope_frequencies(4, 4.0)
    torch.testing.assert_close(
        p0,
        torch.tensor([1.570796, 4.712389, 14.137167, 42.411501], dtype=torch.float64),
        atol=1e-6,
        rtol=0,
    )
    enc = relpos.create("rayrope", num_heads=1, head_dim=96)  # 3 rays, 12 coordinates, F = 4
    assert enc.freqs.shape == (4, 12)
    torch.testing.assert_close(enc.freqs[:, 3], p0 / 2)
    torch.testing.assert_close(enc.freqs[:, 11], p0 * 0.05)


def test_expected_rotation_matches_the_spec():
    c, s = expected_rotation(
        torch.tensor(0.3, dtype=torch.float64), torch.tensor(1.1, dtype=torch.float64)
    )
    assert float(c) == pytest.approx(0.7446089418, abs=1e-9)
    assert float(s) == pytest.approx(0.6271754596, abs=1e-9)
    assert math.hypot(float(c), float(s)) == pytest.approx(0.9735458558, abs=1e-9)
    c, s = expected_rotation(torch.tensor(0.5), torch.tensor(0.505))
    assert float(c) == pytest.approx(math.cos(0.5)) and float(s) == pytest.approx(math.sin(0.5))


def _inputs(sigma: float):
    view, Ks, pos, depth = _tokens()
    ls = torch.stack((depth.log(), torch.full_like(depth, sigma)), -1)
    return {"k_viewmats": view, "k_Ks": Ks, "k_depth_logsigma": ls}, pos


def test_grouped_attention_equals_one_attention_per_query_camera():
    """The official evaluation: per query camera c, SDPA(q_c, k(c), v(c)) on camera-major
    tokens; here from the encoding's own per-group rotations with explicit slices."""
    enc = _rayrope()
    inputs, pos = _inputs(0.2)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 24, generator=gen, dtype=torch.float64) for _ in range(3))
    enc2 = relpos.create(
        "rayrope", num_heads=2, head_dim=24, grid=(2, 2), image_size=IMAGE, rays_per_patch=1
    ).double()
    out = relpos.attention(q, k, v, enc2, q_pos=pos, k_pos=pos, inputs=inputs)
    groups = enc2.prepare_rotary(pos, pos, inputs).groups
    assert len(groups) == 2
    ref = torch.zeros_like(out)
    for rows, st in groups:
        sel = rows[0]
        qr = enc2.rotate(q, pos, "q", st)[:, :, sel]
        kr, vr = enc2.rotate(k, pos, "k", st), enc2.rotate(v, pos, "v", st)
        o = torch.nn.functional.scaled_dot_product_attention(qr, kr, vr)
        full = torch.zeros_like(out)
        full[:, :, sel] = o
        ref[:, :, sel] = enc2.rotate(full, pos, "o", st)[:, :, sel]
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    assert enc.se3_invariant


def test_known_depth_rotations_are_orthogonal_and_round_trip():
    enc = _rayrope()
    inputs, pos = _inputs(0.0)
    x = torch.randn(1, 1, 4, 24, dtype=torch.float64)
    for _, st in enc.prepare_rotary(pos, pos, inputs).groups:
        back = enc.rotate(enc.rotate(x, pos, "k", st), pos, "o", st)
        torch.testing.assert_close(back, x, atol=1e-12, rtol=0)
    # depth doubt attenuates
    inputs, _ = _inputs(0.5)
    (_, st), *_ = enc.prepare_rotary(pos, pos, inputs).groups
    assert float(torch.hypot(st.k_cos, st.k_sin).min()) < 0.999


def test_rayrope_refuses_a_cache_and_bad_depths():
    enc = _rayrope()
    inputs, pos = _inputs(0.1)
    q = torch.randn(1, 1, 4, 24, dtype=torch.float64)
    with pytest.raises(ValueError, match="cache"):
        relpos.attention(
            q, q, q, enc, q_pos=pos, k_pos=pos, inputs=inputs, cache=relpos.nn.LayerCache()
        )
    bad = {**inputs, "k_depth_logsigma": inputs["k_depth_logsigma"][..., :1]}
    with pytest.raises(ValueError, match="k_depth_logsigma"):
        relpos.attention(q, q, q, enc, q_pos=pos, k_pos=pos, inputs=bad)
    with pytest.raises(ValueError, match="head_dim"):
        relpos.create("rayrope", num_heads=1, head_dim=64, identity_channels=False)
    assert relpos.create("rayrope", num_heads=1, head_dim=64).rope_channels == 48


def test_groups_are_per_batch_row_and_equal_each_row_alone():
    """Two scenes with different camera pairs: 2 groups (each row's 1st and 2nd camera), not
    4, and the batched call equals each row called alone."""
    from relpos.encodings.camera.groups import row_camera_groups

    inputs, pos = _inputs(0.2)
    G = world_G()
    other = {
        "k_viewmats": cameras.apply_world_transform(inputs["k_viewmats"], G)[:, [2, 3, 0, 1]],
        "k_Ks": inputs["k_Ks"] * torch.tensor([1.1, 1.1, 1.0], dtype=torch.float64)[:, None],
        "k_depth_logsigma": inputs["k_depth_logsigma"].flip(1),
    }
    both = {n: torch.cat((inputs[n], other[n])) for n in inputs}
    views, Ks, index = row_camera_groups(both["k_viewmats"], both["k_Ks"], 8, "rayrope")
    assert views.shape == (2, 2, 4, 4) and Ks.shape == (2, 2, 3, 3)
    for b in range(2):
        for i in range(4):
            torch.testing.assert_close(views[index[b, i], b], both["k_viewmats"][b, i])
    enc = relpos.create(
        "rayrope", num_heads=2, head_dim=24, grid=(2, 2), image_size=IMAGE, rays_per_patch=1
    ).double()
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 4, 24, generator=gen, dtype=torch.float64) for _ in range(3))
    assert len(enc.prepare_rotary(pos, pos, both).groups) == 2
    out = relpos.attention(q, k, v, enc, q_pos=pos, k_pos=pos, inputs=both)
    for b, part in enumerate((inputs, other)):
        alone = relpos.attention(
            q[b : b + 1], k[b : b + 1], v[b : b + 1], enc, q_pos=pos, k_pos=pos, inputs=part
        )
        torch.testing.assert_close(out[b : b + 1], alone, atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="in one batch row, above group_limit=1"):
        row_camera_groups(both["k_viewmats"], both["k_Ks"], 1, "rayrope")
