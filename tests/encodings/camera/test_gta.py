"""GTA: reference values computed in float64 from the official formulas (autonomousvision/gta) and
claims."""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos import cameras
from relpos.encodings.camera.gta import so2_frequencies, t2_matrices
from relpos.encodings.camera.wigner import real_spherical_harmonics, wigner_d

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


# --------------------------------------------------------------- SO(3) and T(2) sections
def _random_rotations(n: int, seed: int) -> torch.Tensor:
    return cameras.random_se3(n, generator=torch.Generator().manual_seed(seed))[:, :3, :3]


def test_real_wigner_d_is_an_orthogonal_representation():
    R = _random_rotations(3, 0)
    pi = torch.tensor([[0, 1, 0], [0, 0, 1], [1, 0, 0]], dtype=torch.float64)  # (y, z, x)
    torch.testing.assert_close(wigner_d(R, 1), pi @ R @ pi.T, atol=1e-14, rtol=0)
    x = torch.nn.functional.normalize(torch.randn(5, 3, dtype=torch.float64), dim=-1)
    for l in (1, 2, 3):
        D = wigner_d(R, l)
        eye = torch.eye(2 * l + 1, dtype=torch.float64)
        torch.testing.assert_close(D @ D.mT, eye.expand_as(D), atol=1e-13, rtol=0)
        torch.testing.assert_close(D[0] @ D[1], wigner_d(R[0] @ R[1], l), atol=1e-13, rtol=0)
        # the defining property Y(R x) = D(R) Y(x)
        Y_rot = real_spherical_harmonics(x @ R[2].T, l)
        torch.testing.assert_close(
            Y_rot, real_spherical_harmonics(x, l) @ D[2].T, atol=1e-13, rtol=0
        )


def test_real_spherical_harmonics_are_orthonormal():
    """Exact quadrature: Gauss-Legendre in z, uniform in the azimuth."""
    import numpy as np

    z, wz = (torch.tensor(a, dtype=torch.float64) for a in np.polynomial.legendre.leggauss(8))
    phi = torch.arange(16, dtype=torch.float64) * (2 * math.pi / 16)
    zz, pp = torch.meshgrid(z, phi, indexing="ij")
    r = torch.sqrt(1 - zz**2)
    X = torch.stack((r * pp.cos(), r * pp.sin(), zz), -1).reshape(-1, 3)
    w = (wz[:, None] * torch.full_like(phi, 2 * math.pi / 16)).reshape(-1)
    for l in range(4):
        Y = real_spherical_harmonics(X, l)
        gram = Y.T @ (w[:, None] * Y)
        torch.testing.assert_close(
            gram, torch.eye(2 * l + 1, dtype=torch.float64), atol=1e-12, rtol=0
        )


def _gta_full(**options):
    opts = {"se3_dim": 4, "so2_freqs": 1, "so3_degrees": 2, "so3_dim": 8, "t2_dim": 3}
    opts.update(grid=(2, 2), **options)
    return relpos.create("gta", num_heads=1, head_dim=20, **opts).double()


def _inputs20():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 1, 8, 20, generator=gen, dtype=torch.float64) for _ in range(3))
    return q, k, v, tokens()["xy"].flip(-1).double(), tokens()["viewmats"]


def test_so3_and_t2_sections_read_the_relative_rotation_and_patch_offset():
    enc = _gta_full()
    assert (enc.so3_dim, enc.t2_dim, enc.dims) == (8, 3, 2)
    q, k, _, rc, view = _inputs20()
    s = relpos.scores(q, k, enc, q_pos=rc, k_pos=rc, scale=1.0, inputs={"k_viewmats": view})
    same = view[:, :1].expand_as(view)
    base = relpos.scores(q, k, enc, q_pos=rc, k_pos=rc, scale=1.0, inputs={"k_viewmats": same})
    R = view[0, :, :3, :3].mT  # c2w rotations
    rel = R[:, None].mT @ R[None]  # R_i^T R_j
    D = torch.zeros(8, 8, 8, 8, dtype=torch.float64)
    D[..., :3, :3], D[..., 3:, 3:] = wigner_d(rel, 1), wigner_d(rel, 2)
    so3 = torch.einsum("hia,ijab,hjb->hij", q[0, :, :, 8:16], D, k[0, :, :, 8:16])
    plain = q[0, :, :, 8:16] @ k[0, :, :, 8:16].mT
    # the se3 channels differ too: compare the difference on the so3 section alone
    se3_only = relpos.create("gta", num_heads=1, head_dim=20, se3_dim=4, so2_freqs=1, so3_dim=0)
    d_se3 = relpos.scores(
        q, k, se3_only.double(), q_pos=rc, k_pos=rc, scale=1.0, inputs={"k_viewmats": view}
    ) - relpos.scores(
        q, k, se3_only.double(), q_pos=rc, k_pos=rc, scale=1.0, inputs={"k_viewmats": same}
    )
    torch.testing.assert_close((s - base)[0], d_se3[0] + so3 - plain, atol=1e-12, rtol=0)
    # t2: q^T T(p_j - p_i) k with p = (row, col) / grid, identical cameras or not
    p = rc[0] / 2
    T = t2_matrices(p[None] - p[:, None])  # (i, j, 3, 3)
    t2 = torch.einsum("ia,ijab,jb->ij", q[0, 0, :, 16:19], T, k[0, 0, :, 16:19])
    no_t2 = relpos.create(
        "gta",
        num_heads=1,
        head_dim=20,
        se3_dim=4,
        so2_freqs=1,
        so3_degrees=2,
        so3_dim=8,
        grid=(2, 2),
    ).double()
    without = relpos.scores(q, k, no_t2, q_pos=rc, k_pos=rc, scale=1.0, inputs={"k_viewmats": view})
    plain_t2 = q[0, 0, :, 16:19] @ k[0, 0, :, 16:19].T
    torch.testing.assert_close(s[0, 0], without[0, 0] - plain_t2 + t2, atol=1e-12, rtol=0)


def test_so3_and_t2_sections_are_invariant_and_round_trip():
    enc = _gta_full()
    q, k, v, rc, view = _inputs20()
    inputs = {"k_viewmats": view}
    out = relpos.attention(q, k, v, enc, q_pos=rc, k_pos=rc, inputs=inputs)
    moved = {"k_viewmats": cameras.apply_world_transform(view, world_G())}
    torch.testing.assert_close(
        relpos.attention(q, k, v, enc, q_pos=rc, k_pos=rc, inputs=moved), out, atol=1e-12, rtol=0
    )
    shifted = relpos.attention(q, k, v, enc, q_pos=rc + 3, k_pos=rc + 3, inputs=inputs)
    torch.testing.assert_close(shifted, out, atol=1e-12, rtol=0)  # relative in (row, col)
    state = enc.prepare_rotary(rc, rc, inputs)
    back = enc.rotate(enc.rotate(v, rc, "k", state), rc, "o", state)
    torch.testing.assert_close(back, v, atol=1e-12, rtol=0)
    # the sections live in rotate(), shared by every backend (conformance checks the rest)
    other = relpos.attention(q, k, v, enc, q_pos=rc, k_pos=rc, inputs=inputs, backend="sdpa")
    torch.testing.assert_close(other, out, atol=1e-12, rtol=0)


def test_so3_and_t2_sizes_are_checked_by_name():
    with pytest.raises(ValueError, match="so3_dim"):
        relpos.create("gta", num_heads=1, head_dim=24, so3_degrees=2, so3_dim=6)
    with pytest.raises(ValueError, match="t2_dim"):
        relpos.create("gta", num_heads=1, head_dim=24, t2_dim=4)
    with pytest.raises(ValueError, match="head_dim"):
        relpos.create("gta", num_heads=1, head_dim=16, se3_dim=8, so2_freqs=2, t2_dim=3)
    enc = relpos.create("gta", num_heads=1, head_dim=64, so3_degrees=2, t2_dim=6)
    assert (enc.so3_dim, enc.se3_dim, enc.so2_freqs) == (8, 24, 6)  # 8 + 6 + 24 + 24 + 2
