"""Lie-group rotary encodings (``lie.py``): LieRE and MinkowskiPE.

Reference values and formulas (LieRE: StanfordMIMI/LieRE ``models/rope_vit.py``; MinkowskiPE and the
boosts: reconstructions from the abstracts) re-derived here in float64, never from relpos; the
defining properties (identity at zero generators, RoPE as 2x2 blocks, relative exactly when the
generators commute, boosts along time and rotations along space); and the common RoPE options, which
both refuse by name.
"""

from __future__ import annotations

import math

import pytest
import torch

import relpos
from relpos.registry import encoding_class

from .formulas import randn, rope_fp64, theta_fp64

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}


def test_liere_generator_is_skew_with_the_stored_upper_triangle():
    enc = relpos.create("liere", num_heads=1, head_dim=6, dims=2, generator_dim=3 * 2)
    s = enc.generators()
    assert s.shape == (2, 1, 6, 6)
    torch.testing.assert_close(s, -s.mT)
    rows, cols = torch.triu_indices(6, 6, 1)
    torch.testing.assert_close(s[..., rows, cols], enc.generator)
    # the source's raw ~ U(0, 2 pi): every stored entry lies there
    assert (
        0
        <= float(enc.generator.detach().min())
        <= float(enc.generator.detach().max())
        <= 2 * math.pi
    )


def test_liere_with_block_diagonal_2x2_generators_is_interleaved_rope():
    enc = relpos.create("liere", num_heads=1, head_dim=8, generator_dim=2, expected_steps=1.0)
    theta = theta_fp64(8)
    with torch.no_grad():  # S = [[0, s], [-s, 0]] rotates by -s p: s = -theta_i
        enc.generator.copy_(-theta.float().view(1, 4, 1))
    x = randn(1, 1, 6, 8, seed=3)
    pos = torch.tensor([0, 1, 5, 77, 1000, 4097])
    got = enc.rotate(x, pos[None], "q")
    torch.testing.assert_close(
        got.double(), rope_fp64(x, pos, theta, "interleaved"), atol=2e-5, rtol=0
    )


@pytest.mark.parametrize(
    "pos",
    [[[-3, 0, 2, 50, 513]], [[-5, -4, -3, -2, -1, 0, 1, 2, 3, 7]], [[4, 5, 6], [2, 3, 9]]],
    ids=["sparse: binary powering", "range: table of powers", "batch rows"],
)
def test_liere_rotation_is_the_matrix_exponential(pos):
    enc = relpos.create("liere", num_heads=1, head_dim=8, expected_steps=16.0)
    pos = torch.tensor(pos)
    s = enc.generators().double()[0, 0] / 16.0
    ref = torch.linalg.matrix_exp(pos.double()[..., None, None] * s)
    got = enc.rotations(pos)[:, :, 0]  # integer positions: powers of expm(S)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-9)
    got_float = enc.rotations(pos.double())[:, :, 0]  # fractional path: matrix_exp per token
    torch.testing.assert_close(got_float, ref, rtol=0, atol=1e-9)


def boost(phi: float) -> torch.Tensor:
    return torch.tensor(
        [[math.cosh(phi), math.sinh(phi)], [math.sinh(phi), math.cosh(phi)]], dtype=torch.float64
    )


@pytest.mark.parametrize("a,b", [(0.3, -1.1), (2.0, 0.5)])
def test_boost_facts_of_the_spec(a, b):
    eta = torch.diag(torch.tensor([1.0, -1.0], dtype=torch.float64))
    torch.testing.assert_close(boost(a) @ boost(b), boost(a + b))
    torch.testing.assert_close(boost(a).T @ eta @ boost(b), eta @ boost(b - a))
    light = torch.tensor([1.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(boost(a) @ light, math.exp(a) * light)


def test_minkowski_score_is_the_block_formula():
    enc = relpos.create("minkowski", num_heads=1, head_dim=8, dims=3, max_rapidity=0.05)
    q, k = randn(1, 1, 3, 8, seed=1), randn(1, 1, 4, 8, seed=2)
    qp = torch.tensor([[[5.0, 1, 2], [6, 3, 0], [9, -2, 4]]])
    kp = torch.tensor([[[0.0, 0, 0], [2, 1, 7], [4, 4, 4], [8, -1, 2]]])
    eta = torch.diag(torch.tensor([1.0, -1.0], dtype=torch.float64))
    rates = 0.05 * 1e4 ** (-torch.arange(2, dtype=torch.float64) / 2)
    # block b rotates with axis 1 + b % 2, rank 0 on each axis: theta = 1
    ref = torch.zeros(3, 4, dtype=torch.float64)
    for i in range(3):
        for j in range(4):
            d = (kp[0, j] - qp[0, i]).double()
            for b in range(2):
                qb, kb = (
                    q[0, 0, i, 4 * b : 4 * b + 4].double(),
                    k[0, 0, j, 4 * b : 4 * b + 4].double(),
                )
                ref[i, j] += qb[:2] @ eta @ boost(float(rates[b] * d[0])) @ kb[:2]
                ang = float(d[1 + b])
                rot = torch.tensor(
                    [[math.cos(ang), -math.sin(ang)], [math.sin(ang), math.cos(ang)]],
                    dtype=torch.float64,
                )
                ref[i, j] += qb[2:] @ rot @ kb[2:]
    got = relpos.scores(q, k, enc, q_pos=qp, k_pos=kp, scale=1.0)[0, 0]
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)


def test_liere_with_zero_generator_is_the_identity():
    enc = relpos.create("liere", num_heads=2, head_dim=8, dims=2)
    with torch.no_grad():
        enc.generator.zero_()
    x = randn(1, 2, 5, 8, seed=1)
    pos = randn(1, 5, 2, seed=2) * 100
    torch.testing.assert_close(enc.rotate(x, pos, "q"), x)


def test_liere_1d_is_relative_with_dense_generators():
    enc = relpos.create("liere", num_heads=2, head_dim=8, expected_steps=8.0)
    assert enc.relative
    q, k = randn(1, 2, 6, 8, seed=1), randn(1, 2, 6, 8, seed=2)
    pos = torch.tensor([0, 3, 4, 9, 10, 15])
    ref = relpos.scores(q, k, enc, q_pos=pos, k_pos=pos)
    torch.testing.assert_close(relpos.scores(q, k, enc, q_pos=pos + 999, k_pos=pos + 999), ref)


def test_liere_2d_dense_generators_are_not_relative_but_2x2_blocks_are():
    q, k = randn(1, 2, 6, 8, seed=1), randn(1, 2, 6, 8, seed=2)
    pos = randn(1, 6, 2, seed=3) * 4
    dense = relpos.create("liere", num_heads=2, head_dim=8, dims=2, expected_steps=4.0)
    assert not dense.relative
    moved = relpos.scores(q, k, dense, q_pos=pos + 3, k_pos=pos + 3)
    assert not torch.allclose(moved, relpos.scores(q, k, dense, q_pos=pos, k_pos=pos), atol=1e-3)
    blocks = relpos.create("liere", num_heads=2, head_dim=8, dims=2, generator_dim=2)
    assert blocks.relative
    torch.testing.assert_close(
        relpos.scores(q, k, blocks, q_pos=pos + 3, k_pos=pos + 3),
        relpos.scores(q, k, blocks, q_pos=pos, k_pos=pos),
        rtol=1e-4,
        atol=1e-4,
    )


def test_liere_bad_generator_dim():
    with pytest.raises(ValueError, match="generator_dim"):
        relpos.create("liere", num_heads=1, head_dim=8, generator_dim=3)
    with pytest.raises(ValueError, match="expected_steps"):
        relpos.create("liere", num_heads=1, head_dim=8, expected_steps=0)


def test_minkowski_boosts_along_time_and_rotates_along_space():
    enc = relpos.create("minkowski", num_heads=1, head_dim=8, dims=2, max_rapidity=0.01)
    rate = float(enc.rates[0])
    light = torch.zeros(1, 1, 1, 8)
    light[..., 0], light[..., 1] = 1.0, -1.0  # q on the (1, -1) light-cone line of block 0
    key = torch.zeros(1, 1, 1, 8)
    key[..., 0], key[..., 1] = 1.0, 1.0  # k on (1, 1)
    for dt in (0.0, 5.0, 40.0):
        s = relpos.scores(
            light,
            key,
            enc,
            q_pos=torch.tensor([[[0.0, 3.0]]]),
            k_pos=torch.tensor([[[dt, 3.0]]]),
            scale=1.0,
        )
        # q^T eta B(kappa dt) k = (1, 1) . (1, 1) e^{kappa dt}
        torch.testing.assert_close(s.flatten(), torch.tensor([2 * math.exp(rate * dt)]))
    spatial = randn(1, 1, 2, 8, seed=1)
    spatial[..., [0, 1, 4, 5]] = 0  # rotation planes only: plain 1-D RoPE in the space axis
    pos = torch.tensor([[[7.0, 2.0], [7.0, 9.0]]])
    s = relpos.scores(spatial[:, :, :1], spatial[:, :, 1:], enc, q_pos=pos[:, :1], k_pos=pos[:, 1:])
    rope = relpos.create("rope", num_heads=1, head_dim=4, layout="interleaved", base=1e4)
    ref = relpos.scores(
        spatial[:, :, :1][..., [2, 3, 6, 7]],
        spatial[:, :, 1:][..., [2, 3, 6, 7]],
        rope,
        q_pos=torch.tensor([2]),
        k_pos=torch.tensor([9]),
        scale=8**-0.5,
    )
    torch.testing.assert_close(s, ref)


def test_minkowski_rejects_bad_options_and_overflowing_rapidities():
    with pytest.raises(ValueError, match="dims"):
        relpos.create("minkowski", num_heads=1, head_dim=8, dims=1)
    with pytest.raises(ValueError, match="head_dim"):
        relpos.create("minkowski", num_heads=1, head_dim=6)
    enc = relpos.create("minkowski", num_heads=1, head_dim=8, dims=2, max_rapidity=1.0)
    pos = torch.tensor([[[0, 0], [500, 0]]])
    with pytest.raises(ValueError, match="max_rapidity"):
        relpos.scores(randn(1, 1, 2, 8), randn(1, 1, 2, 8), enc, q_pos=pos, k_pos=pos)


# ----------------------------------------------------------------------- options and flags
REFUSED = {
    "base": 500.0,
    "layout": "half",
    "partial_rotary_factor": 0.5,
    "scaling": YARN,
    "max_position_embeddings": 64,
}


@pytest.mark.parametrize("name", ["liere", "liere-2d", "minkowski"])
@pytest.mark.parametrize("option", sorted(REFUSED))
def test_the_rope_options_are_refused_by_name(name, option):
    """Learned dense generators (LieRE) and boost + rotation blocks (MinkowskiPE) have no
    RoPE spectrum, pair layout or partial rotation: such an option is a ValueError naming it
    (MinkowskiPE's own ``base`` sets its spectrum)."""
    if name == "minkowski" and option == "base":
        enc = relpos.create(name, num_heads=1, head_dim=8, base=500.0)
        assert enc.base == 500.0
        return
    with pytest.raises(ValueError, match=option):
        relpos.create(name, num_heads=1, head_dim=8, **{option: REFUSED[option]})
    relpos.create(name, num_heads=1, head_dim=8, **{option: None})  # the default is accepted


def test_liere_2d_flags_say_two_axes_and_not_relative():
    cls = encoding_class("liere-2d")
    enc = relpos.create("liere-2d", num_heads=1, head_dim=8)
    assert (cls.dims, cls.relative) == (2, False)
    assert (enc.dims, enc.relative) == (2, False)
    assert relpos.create("liere-2d", num_heads=1, head_dim=8, generator_dim=2).relative


def test_options_follow_the_policy():
    with pytest.raises(TypeError, match="dims"):
        relpos.create("liere", num_heads=1, head_dim=8, dims=1.5)
    with pytest.raises(TypeError, match="init_range"):
        relpos.create("liere", num_heads=1, head_dim=8, init_range="1")
    with pytest.raises(ValueError, match="init_range"):
        relpos.create("liere", num_heads=1, head_dim=8, init_range=-1.0)
    with pytest.raises(ValueError, match="max_rapidity"):
        relpos.create("minkowski", num_heads=1, head_dim=8, max_rapidity=math.nan)
    with pytest.raises(TypeError, match="base"):
        relpos.create("minkowski", num_heads=1, head_dim=8, base="1e4")
