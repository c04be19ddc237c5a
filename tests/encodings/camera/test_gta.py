"""GTA: the spec's reference values (camera §R.2, R.12) and claims."""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos import cameras
from relpos.encodings.camera.gta import so2_frequencies

from .scene import qk, tokens, world_G

R12_ROW0 = [4.647068, 3.932846, 3.466668, 1.104665, 3.486886, 0.544983, 0.012493, 1.388518]


def _gta(**options):
    opts = {"se3_dim": 8, "so2_freqs": 2, "grid": (2, 2), **options}
    return relpos.create("gta", num_heads=1, head_dim=16, **opts).double()


def _scores(enc, view):
    q, k = qk()
    rc = tokens()["xy"].flip(-1)  # GTA reads (row, col)
    return relpos.scores(q, k, enc, q_pos=rc, k_pos=rc, scale=1.0, inputs={"k_viewmats": view})


def test_gta_logits_match_the_spec_reference_row():
    s = _scores(_gta(), tokens()["viewmats"])[0, 0, 0]
    torch.testing.assert_close(s, torch.tensor(R12_ROW0, dtype=torch.float64), atol=2e-6, rtol=0)


def test_gta_is_invariant_to_a_rigid_world_change():
    view = tokens()["viewmats"]
    moved = cameras.apply_world_transform(view, world_G())
    torch.testing.assert_close(_scores(_gta(), moved), _scores(_gta(), view), atol=1e-12, rtol=0)


def test_so2_frequencies_match_the_spec():
    expected = [0.049087, 0.098175, 0.196350, 0.392699, 0.785398, 1.570796, 3.141593, 6.283185]
    torch.testing.assert_close(
        so2_frequencies(8), torch.tensor(expected, dtype=torch.float64), atol=1e-6, rtol=0
    )
    assert torch.allclose(
        so2_frequencies(2), torch.tensor([math.pi, 2 * math.pi], dtype=torch.float64)
    )


def test_translation_scale_applies_to_the_matrix_and_its_inverse():
    enc = _gta(trans_coeff=0.37)
    view = tokens()["viewmats"]
    T, T_inv = enc.camera_blocks(view.double(), None, None)
    torch.testing.assert_close(
        T @ T_inv, torch.eye(4, dtype=torch.float64).expand_as(T), atol=1e-15, rtol=0
    )
    # conjugation by D_s = diag(1, 1, 1, 1/s)
    s = float(enc.trans_coeff.detach())  # 0.37 as the parameter holds it
    Ds = torch.diag(torch.tensor([1, 1, 1, 1 / s], dtype=torch.float64))
    torch.testing.assert_close(T, Ds @ view @ torch.linalg.inv(Ds), atol=1e-12, rtol=0)


def test_trans_coeff_trains():
    enc = _gta()
    assert enc.trans_coeff.requires_grad and float(enc.trans_coeff.detach()) == pytest.approx(0.01)
    s = _scores(enc, tokens()["viewmats"])
    (g,) = torch.autograd.grad(s.sum(), enc.trans_coeff)
    assert torch.isfinite(g) and float(g.abs()) > 0
    fixed = relpos.create("gta", num_heads=1, head_dim=16, learn_trans_coeff=False)
    assert not fixed.learnable


def test_identical_cameras_leave_only_the_so2_rotation():
    t = tokens()
    enc = _gta()
    same = t["viewmats"][:, 4:5].expand(1, 8, 4, 4)
    q, k = qk()
    rc = t["xy"].flip(-1).double()
    s = _scores(enc, same)
    # so2 oracle: interleaved pairs (pi, row), (pi, col), (2 pi, row), (2 pi, col); HF sign
    ang = torch.stack(
        (
            rc[0, :, 0] * math.pi / 2,
            rc[0, :, 1] * math.pi / 2,
            rc[0, :, 0] * math.pi,
            rc[0, :, 1] * math.pi,
        ),
        -1,
    ).double()

    def rot(x):
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack(
            (a * ang.cos() - b * ang.sin(), a * ang.sin() + b * ang.cos()), -1
        ).flatten(-2)

    ref = q[..., :8] @ k[..., :8].transpose(-1, -2) + rot(q[..., 8:]) @ rot(k[..., 8:]).transpose(
        -1, -2
    )
    torch.testing.assert_close(s, ref, atol=1e-12, rtol=0)


def test_default_sections_split_the_head_and_odd_sizes_are_refused():
    enc = relpos.create("gta", num_heads=6, head_dim=64)
    assert (enc.se3_dim, enc.so2_freqs) == (32, 8)  # CLEVR-TR: se3 32 + so2 32
    msn = relpos.create("gta", num_heads=4, head_dim=96)
    assert (msn.se3_dim, msn.so2_freqs) == (48, 12)
    with pytest.raises(ValueError, match="head_dim"):
        relpos.create("gta", num_heads=1, head_dim=16, se3_dim=6)
    with pytest.raises(ValueError, match="head_dim"):
        relpos.create("gta", num_heads=1, head_dim=16, se3_dim=8, so2_freqs=3)
    with pytest.raises(ValueError, match="trans_coeff"):
        relpos.create("gta", num_heads=1, head_dim=16, trans_coeff=0.0)
    # identity channels when the sections are given explicitly
    assert relpos.create("gta", num_heads=1, head_dim=18, se3_dim=8, so2_freqs=2).head_dim == 18
