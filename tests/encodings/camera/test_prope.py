"""PRoPE and StereoWorld: reference values computed in float64 from the official formulas
(liruilong940607/prope) and claims."""

from __future__ import annotations

import pytest
import torch

import relpos
from relpos import cameras

from .scene import IMAGE, camera_a, camera_b, qk, tokens, world_G


def _prope(**options):
    return relpos.create("prope", num_heads=1, head_dim=16, image_size=IMAGE, **options).double()


def _scores(enc, inputs, xy=None):
    q, k = qk()
    xy = tokens()["xy"] if xy is None else xy
    return relpos.scores(q, k, enc, q_pos=xy, k_pos=xy, scale=1.0, inputs=inputs)


R1_ROW0 = [4.647068, 6.155427, 7.393671, 6.429273, 0.834941, -1.796160, -5.246430, -5.858715]
R1_ROW5 = [-4.075607, -6.686169, -6.197177, -5.600463, -0.804836, 2.326920, 4.160513, 6.416522]
R2_ROW0 = [4.647068, 6.155427, 7.393671, 6.429273, 1.225507, -1.332380, -4.822985, -5.579279]


def test_prope_logits_match_the_spec_reference_rows():
    t = tokens()
    s = _scores(_prope(), {"k_viewmats": t["viewmats"], "k_Ks": t["Ks"]})[0, 0]
    torch.testing.assert_close(s[0], torch.tensor(R1_ROW0, dtype=torch.float64), atol=2e-6, rtol=0)
    torch.testing.assert_close(s[5], torch.tensor(R1_ROW5, dtype=torch.float64), atol=2e-6, rtol=0)


def test_prope_without_intrinsics_is_the_gta_formula():
    s = _scores(_prope(), {"k_viewmats": tokens()["viewmats"]})[0, 0]
    torch.testing.assert_close(s[0], torch.tensor(R2_ROW0, dtype=torch.float64), atol=2e-6, rtol=0)


def test_relative_projection_matches_the_spec_matrix():
    K = cameras.normalize_K(tokens()["Ks"][0, 0], IMAGE)
    torch.testing.assert_close(K, torch.diag(torch.tensor([1.25, 1.25, 1.0], dtype=torch.float64)))
    enc = _prope()
    P, _ = enc.camera_blocks(camera_a()[None, None], tokens()["Ks"][:, :1], None)
    _, P_inv = enc.camera_blocks(camera_b()[None, None], tokens()["Ks"][:, :1], None)
    expected = torch.tensor(
        [
            [0.707107, -0.123091, 0.870388, -2.5],
            [0, 0.984732, 0.217597, -0.625],
            [-0.565685, -0.098473, 0.696311, 1],
            [0, 0, 0, 1],
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close((P @ P_inv)[0, 0], expected, atol=1e-6, rtol=0)
    # the closed-form inverse is the inverse
    P_b, P_b_inv = enc.camera_blocks(camera_b()[None, None], tokens()["Ks"][:, :1], None)
    torch.testing.assert_close(P_b @ P_b_inv, torch.eye(4, dtype=torch.float64)[None, None])


def test_rope_frequencies_match_the_spec_for_head_dim_64():
    enc = relpos.create("prope", num_heads=1, head_dim=64)
    expected = [1, 0.5623413, 0.3162278, 0.1778279, 0.1, 0.0562341, 0.0316228, 0.0177828]
    torch.testing.assert_close(
        enc.inv_freq, torch.tensor(expected, dtype=torch.float64), atol=1e-7, rtol=0
    )


def test_identical_cameras_are_nope_plus_2d_rope_with_the_prope_sign():
    """Oracle: relpos rope-axial (per-axis spectrum, base 100) on the RoPE half, with
    negated positions and its pair layout (pairs (c, c + 4) over 8 channels)."""
    t = tokens()
    q, k = qk()
    xy = t["xy"]
    same = {"k_viewmats": camera_b().expand(1, 8, 4, 4), "k_Ks": t["Ks"]}
    s = _scores(_prope(), same)
    axial = relpos.create("rope-axial", num_heads=1, head_dim=8, base=100.0, layout="half").double()
    perm = torch.tensor([0, 1, 4, 5, 2, 3, 6, 7])  # PRoPE split-half per axis -> axial pairs
    rope = relpos.scores(
        q[..., 8:][..., perm], k[..., 8:][..., perm], axial, q_pos=-xy, k_pos=-xy, scale=1.0
    )
    ref = q[..., :8] @ k[..., :8].transpose(-1, -2) + rope
    torch.testing.assert_close(s, ref, atol=1e-6, rtol=0)


def test_world_scale_and_camera_to_world_mistakes_change_the_logits():
    """Neither the world scale nor w2c vs c2w is a symmetry: both change the logits."""
    t = tokens()
    enc = _prope()
    s0 = _scores(enc, {"k_viewmats": t["viewmats"], "k_Ks": t["Ks"]})
    scaled = t["viewmats"].clone()
    scaled[..., :3, 3] *= 2
    assert float((_scores(enc, {"k_viewmats": scaled, "k_Ks": t["Ks"]}) - s0).abs().max()) > 1
    moved = cameras.apply_world_transform(t["viewmats"], world_G())
    s1 = _scores(enc, {"k_viewmats": moved, "k_Ks": t["Ks"]})
    torch.testing.assert_close(s1, s0, atol=1e-12, rtol=0)
    c2w = {"k_viewmats": cameras.invert_se3(t["viewmats"]), "k_Ks": t["Ks"]}
    c2w_moved = {"k_viewmats": cameras.invert_se3(moved), "k_Ks": t["Ks"]}
    assert float((_scores(enc, c2w) - _scores(enc, c2w_moved)).abs().max()) > 1


def test_per_image_cameras_expand_to_the_per_token_form():
    t = tokens()
    per_camera = torch.stack((camera_a(), camera_b()))[None]
    index = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1]])
    view = cameras.expand_cameras(per_camera, index)
    torch.testing.assert_close(view, t["viewmats"], rtol=0, atol=0)


def test_intrinsics_need_an_image_size():
    enc = relpos.create("prope", num_heads=1, head_dim=16).double()
    t = tokens()
    with pytest.raises(ValueError, match="image_size"):
        _scores(enc, {"k_viewmats": t["viewmats"], "k_Ks": t["Ks"]})


def test_bad_rope_fraction_for_the_head_is_refused():
    with pytest.raises(ValueError, match="head_dim=12"):
        relpos.create("prope", num_heads=1, head_dim=12)
    assert relpos.create("prope", num_heads=1, head_dim=16, rope_fraction=0.25).rope_channels == 4


def test_stereoworld_is_prope_on_every_channel_without_principal_point():
    t = tokens()
    enc = relpos.create("stereoworld", num_heads=1, head_dim=16, image_size=IMAGE).double()
    assert enc.proj_channels == 16 and enc.rope_channels == 0 and enc.dims == 1
    ref = _prope(rope_fraction=0.0, principal_point="zero")
    xy = t["xy"][..., 0]
    inputs = {"k_viewmats": t["viewmats"], "k_Ks": t["Ks"]}
    torch.testing.assert_close(_scores(enc, inputs, xy), _scores(ref, inputs, xy), rtol=0, atol=0)
    P, _ = enc.camera_blocks(camera_a()[None, None], t["Ks"][:, :1], None)
    lifted = torch.diag(torch.tensor([1.25, 1.25, 1.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(P[0, 0], lifted @ camera_a())
    with pytest.raises(ValueError, match="rope_fraction"):
        relpos.create("stereoworld", num_heads=1, head_dim=16, rope_fraction=0.5)
